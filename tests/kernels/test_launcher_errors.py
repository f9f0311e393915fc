"""Bad input is rejected with a clear message before any kernel touches memory, on both backends.

Sets TRITON_INTERPRET=1 before the Triton modules are imported (see test_decode_triton.py).
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from sparrow.kernels import SelectedPages, decode_triton, paged_decode, select_pages  # noqa: E402

if not decode_triton.INTERPRETED:
    pytest.skip("Triton was imported before TRITON_INTERPRET was set", allow_module_level=True)

BACKENDS = ["torch", "triton"]


@pytest.fixture
def batch(paged_batch):
    return paged_batch([40, 20], num_kv_heads=2, group=2, head_dim=64)  # 3 and 2 pages, 8 in pool


def call(batch, backend, **overrides):
    args = dict(
        q=batch.q,
        k_cache=batch.k_cache,
        v_cache=batch.v_cache,
        page_table=batch.page_table,
        seq_lens=batch.seq_lens,
    )
    args.update(overrides)
    return paged_decode(**args, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "make_override,error,message",
    [
        (lambda b: {"q": b.q[0]}, ValueError, r"q must be \(B, H_q, D\)"),
        (lambda b: {"q": b.q[:, :3]}, ValueError, "not a multiple of H_kv"),
        (lambda b: {"q": b.q[..., :32]}, ValueError, "head dim 32 != cache head dim 64"),
        (lambda b: {"v_cache": b.v_cache[:, :8]}, ValueError, "v_cache shape"),
        (lambda b: {"q": b.q.double()}, TypeError, "fp16/bf16/fp32"),
        (lambda b: {"q": b.q.bfloat16()}, TypeError, "dtypes differ"),
        (lambda b: {"page_table": b.page_table.long()}, TypeError, "page_table must be int32"),
        (
            lambda b: {"seq_lens": b.seq_lens[:1]},
            ValueError,
            "seq_lens must have 1 dims with batch 2",
        ),
        (lambda b: {"q": b.q.transpose(1, 2).contiguous().transpose(1, 2)}, ValueError, "stride 1"),
        (
            lambda b: {"k_cache": b.k_cache.transpose(0, 1).contiguous().transpose(0, 1)},
            ValueError,
            "contiguous",
        ),
        (
            lambda b: {"seq_lens": torch.tensor([40, 0], dtype=torch.int32)},
            ValueError,
            "seq_lens must be >= 1",
        ),
        (
            lambda b: {"seq_lens": torch.tensor([40, 200], dtype=torch.int32)},
            ValueError,
            "page_table has 5 columns",
        ),
    ],
)
def test_decode_rejects_malformed_tensors(batch, backend, make_override, error, message):
    with pytest.raises(error, match=message):
        call(batch, backend, **make_override(batch))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad_id", [8, 10_000, -1])
def test_decode_rejects_out_of_range_page_ids(batch, backend, bad_id):
    table = batch.page_table.clone()
    table[1, 1] = bad_id
    with pytest.raises(
        ValueError, match=rf"page_table\[1, 1\] = {bad_id} is out of range \[0, 8\)"
    ):
        call(batch, backend, page_table=table)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_rejects_bad_selection(batch, backend):
    pages = torch.tensor([[[0, 2], [0, 1]], [[0, 1], [1, 2]]], dtype=torch.int32)  # (B, H_kv, S)
    two = torch.tensor([2, 2], dtype=torch.int32)
    with pytest.raises(
        ValueError, match=r"logical_pages\[1, 1, 1\] = 2 is outside the sequence's 2"
    ):
        paged_decode(*_args(batch), SelectedPages(pages, two), backend=backend)
    with pytest.raises(ValueError, match="num_selected must lie in"):
        paged_decode(
            *_args(batch),
            SelectedPages(pages, torch.tensor([3, 1], dtype=torch.int32)),
            backend=backend,
        )
    with pytest.raises(ValueError, match=r"\(B, H_kv=2, S\)"):
        paged_decode(*_args(batch), SelectedPages(pages[:, :1], two), backend=backend)


def test_padding_past_num_selected_is_not_checked_or_read(batch):
    pages = torch.tensor([[[0, 2], [1, 2]], [[1, 99], [0, -5]]], dtype=torch.int32)
    counts = torch.tensor([2, 1], dtype=torch.int32)
    out = paged_decode(*_args(batch), SelectedPages(pages, counts), backend="triton")
    assert torch.isfinite(out).all()


def test_triton_rejects_head_dim_it_cannot_tile(paged_batch):
    odd = paged_batch([20], num_kv_heads=1, group=1, head_dim=48)
    assert torch.isfinite(paged_decode(*_args(odd), backend="torch")).all()
    with pytest.raises(ValueError, match="power of 2"):
        paged_decode(*_args(odd), backend="triton")


def test_unknown_backend(batch):
    with pytest.raises(ValueError, match="backend must be one of"):
        paged_decode(*_args(batch), backend="cuda")


def test_select_rejects_bad_arguments(batch):
    args = (batch.q, batch.summary, batch.page_table, batch.seq_lens)
    with pytest.raises(ValueError, match="budget must be >= num_sink \\+ num_recent = 3"):
        select_pages(*args, torch.tensor([2, 5], dtype=torch.int32))
    budgets = torch.tensor([3, 3], dtype=torch.int32)
    with pytest.raises(ValueError, match="score must be one of"):
        select_pages(*args, budgets, score="dot")
    table = batch.page_table.clone()
    table[0, 2] = 8
    with pytest.raises(ValueError, match="out of range"):
        select_pages(batch.q, batch.summary, table, batch.seq_lens, budgets, backend="triton")
    with pytest.raises(TypeError, match="budgets must be int32"):
        select_pages(*args, budgets.long())


def _args(batch):
    return (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens)
