"""Sync guard: once a decode step is planned, its forward reads no device value back.

A 28-layer model with Qwen3-1.7B's attention shapes (16 query / 8 KV heads, head dim 128; small
hidden size and vocabulary, which do not change the ops), layers 0-1 dense and the rest sparse,
decodes a sparse then a dense step under a dispatch mode that raises on `.item()`/`.tolist()`
(aten._local_scalar_dense) and on ops whose output shape depends on data (nonzero, unique,
masked_select, boolean-mask indexing). Torch backend in fp32 and bf16; the Triton kernels in the
interpreter (slow: 3 layers, one sequence).
"""

import pytest
import torch

from sparrow.bench.dispatch_counter import DispatchCounter
from sparrow.bench.random_runner import RandomWeights, advance, prefilled_runner, qwen3_1p7b_shaped

LENS = [70, 40, 33]  # 5, 3, 3 pages: one row sparse, two read every page at budget 4


@pytest.fixture(scope="module")
def weights_28():
    return RandomWeights(qwen3_1p7b_shaped(layers=28))


def guard_forward(runner) -> list[int]:
    """Run the runner's forward (everything after the plan) under the strict guard; returns a
    list that counts the guarded calls."""
    calls = []
    for owner, name in ((runner.model, "decode"), (runner.kv, "prepare_decode")):
        inner = getattr(owner, name, None)
        if inner is None:  # older code builds its plan inside the forward
            continue

        def guarded(*args, _inner=inner, **kwargs):
            calls.append(1)
            with DispatchCounter(strict=True):
                return _inner(*args, **kwargs)

        setattr(owner, name, guarded)
    return calls


def decode_sparse_then_dense(runner, seqs, bm, budget: int):
    calls = guard_forward(runner)
    for budgets in ([budget] * len(seqs), None):
        logits = runner.decode(seqs, budgets, update_summaries=True)
        assert logits.shape == (len(seqs), runner.model.shape.vocab_size)
        assert torch.isfinite(logits).all()
        advance(seqs, bm, logits)
    assert len(calls) >= 2  # the guard was really in place


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_backend_decode_forward_has_no_host_sync(weights_28, dtype):
    config = weights_28.config
    runner, seqs, bm = prefilled_runner(config, dtype, "torch", LENS, weights=weights_28)
    decode_sparse_then_dense(runner, seqs, bm, budget=4)
    # A second pair: the dense layers now append to their contiguous copies.
    decode_sparse_then_dense(runner, seqs, bm, budget=4)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_backend_decode_forward_has_no_host_sync(dtype):
    config = qwen3_1p7b_shaped(layers=3)
    runner, seqs, bm = prefilled_runner(config, dtype, "triton", [70])
    decode_sparse_then_dense(runner, seqs, bm, budget=4)
