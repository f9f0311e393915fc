"""Decode cost model: a hand-computed case, dense limit, monotonicity in the budget."""

from dataclasses import replace
from itertools import pairwise

import pytest

from sparrow.control.cost_model import (
    CostConfig,
    decode_cost,
    engine_cost_config,
    predicted_speedup,
    weights_read,
)
from sparrow.control.schedule import BudgetSchedule
from sparrow.models.shape import ModelShape

TINY = ModelShape(
    num_layers=2,
    hidden_size=4,
    intermediate_size=8,
    num_q_heads=2,
    num_kv_heads=1,
    head_dim=2,
    vocab_size=10,
)
CFG = CostConfig(
    16, flops_per_byte=10.0, num_dense_layers=1, summary_vectors_per_page=1, dtype_bytes=2
)
# Qwen3-1.7B's shape.
QWEN3_1P7B = ModelShape(28, 2048, 6144, 16, 8, 128, 151936)


def _sched(pages):
    return BudgetSchedule(bin_tokens=2000, budgets_pages=(pages,))


def test_hand_computed_case():
    # Params per layer: q 16 + k 8 + v 8 + o 16 + MLP 96 = 144; x2 layers + LM head 40 = 328.
    assert weights_read(TINY) == 328
    # One step (prompt 32, 1 token), batch 1. Linear: 656 FLOPs, 656 bytes.
    # Dense layer over 32 tokens: 4*2*2*32 = 512 FLOPs, 2*1*2*2*32 = 256 bytes.
    dense = decode_cost(TINY, 32, 1, 1, None, CFG)
    assert (dense.compute_flops, dense.memory_bytes) == (656 + 2 * 512, 656 + 2 * 256)
    assert dense.eflops == 1680 + 10 * 1168
    # Sparse layer 1 at 1 page: 16 tokens (256 FLOPs, 128 bytes) + 2 page summaries
    # (2 pages * 1 kv head * 2 dims * 2 bytes = 8 bytes; 2 pages * 2*2*2 = 16 FLOPs).
    sparse = decode_cost(TINY, 32, 1, 1, _sched(1), CFG)
    assert (sparse.compute_flops, sparse.memory_bytes) == (
        656 + 512 + 256 + 16,
        656 + 256 + 128 + 8,
    )
    assert predicted_speedup(TINY, 32, 1, 1, _sched(1), CFG) == pytest.approx(13360 / 11920)
    # The same 16 tokens as 2 pages of 8 (the engine's page size, read from the config): 4 page
    # summaries instead of 2.
    half_pages = decode_cost(TINY, 32, 1, 1, _sched(2), replace(CFG, page_size=8))
    assert (half_pages.compute_flops, half_pages.memory_bytes) == (
        656 + 512 + 256 + 32,
        656 + 256 + 128 + 16,
    )


def test_batch_amortises_parameter_reads():
    one = decode_cost(TINY, 32, 1, 1, None, CFG)
    four = decode_cost(TINY, 32, 1, 4, None, CFG)
    assert four.memory_bytes == 656 + 4 * 512 and four.compute_flops == 4 * one.compute_flops


def test_budget_covering_all_pages_costs_only_the_summaries():
    cfg = CostConfig(page_size=16)
    ratio = predicted_speedup(QWEN3_1P7B, 4096, 2048, 64, _sched(1024), cfg)  # 6K < 16K tokens
    assert 0.97 < ratio < 1.0


def test_speedup_falls_as_budget_grows_and_rises_with_context():
    cfg = CostConfig(page_size=16)
    speedups = [
        predicted_speedup(QWEN3_1P7B, 8192, 4096, 64, _sched(p), cfg) for p in (32, 64, 128, 256)
    ]
    assert all(a > b for a, b in pairwise(speedups)), speedups
    assert speedups[0] > 2.0
    short = predicted_speedup(QWEN3_1P7B, 1024, 1024, 64, _sched(32), cfg)
    assert short < speedups[0]


def test_the_engines_bf16_halves_the_kv_bytes_charged():
    fp32, bf16 = (engine_cost_config(16, 2, d) for d in ("float32", "bfloat16"))
    assert (fp32.dtype_bytes, bf16.dtype_bytes) == (4, 2)
    assert (fp32.page_size, fp32.num_dense_layers) == (16, 2)

    def kv_bytes(cfg):  # the bytes one more token of context adds: K/V, not weights
        longer = decode_cost(QWEN3_1P7B, 4097, 1, 8, None, cfg).memory_bytes
        return longer - decode_cost(QWEN3_1P7B, 4096, 1, 8, None, cfg).memory_bytes

    assert kv_bytes(bf16) == kv_bytes(fp32) / 2 == 8 * 28 * 2 * 8 * 128 * 2
    # The predicted speedup weighs them: a sparse schedule saves more of a larger share of bytes.
    cfg = replace(bf16, flops_per_byte=206.0)
    assert predicted_speedup(QWEN3_1P7B, 8192, 1024, 64, _sched(64), cfg) < predicted_speedup(
        QWEN3_1P7B, 8192, 1024, 64, _sched(64), replace(cfg, dtype_bytes=4)
    )
