"""Triton decode and scoring kernels under the interpreter (CPU) against the references.

TRITON_INTERPRET is read when a kernel is decorated, so it is set before sparrow.kernels'
Triton modules are imported (they are imported lazily, on first Triton call). It stays set for
the rest of the pytest process; other tests only use the torch backend on CPU tensors.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from sparrow.kernels import decode_triton, paged_decode, score_triton, select_pages  # noqa: E402
from sparrow.kernels.reference import attention_reference  # noqa: E402
from sparrow.kernels.selection import page_scores_torch  # noqa: E402

if not (decode_triton.INTERPRETED and score_triton.INTERPRETED):
    pytest.skip("Triton was imported before TRITON_INTERPRET was set", allow_module_level=True)

LENS = [70, 100, 16, 33, 1]  # 5, 7, 1, 3, 1 pages: partial and exact last pages, one token
BUDGETS = [
    3,
    5,
    4,
    8,
    3,
]  # sparse (budget 3), sparse, dense (1 page), dense (budget > pages), dense
SHAPES = [(1, 128), (3, 64), (4, 64), (8, 128)]  # (GQA group, head dim)


def decode_args(batch, selected=None):
    return (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens, selected)


@pytest.mark.parametrize("group,head_dim", SHAPES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_sparse_kernel_equals_reference(
    paged_batch, poison_unselected, group, head_dim, num_splits
):
    batch = paged_batch(LENS, num_kv_heads=2, group=group, head_dim=head_dim, strided_table=True)
    budgets = torch.tensor(BUDGETS, dtype=torch.int32)
    selected = select_pages(batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets)
    poison_unselected(batch, selected.logical_pages, selected.num_selected)
    out = decode_triton.paged_decode_triton(
        *decode_args(batch, selected), head_dim**-0.5, num_splits=num_splits
    )
    expected = attention_reference(*decode_args(batch, selected))
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_sparse_kernel_reads_the_selections_physical_ids(paged_batch, num_splits):
    """Each selected page's physical id comes from `SelectedPages.physical_pages` (the selection
    emits it), not from a sel -> page_table gather: with every page moved to another physical id
    and only the selection's physical ids updated (the page table now points at wrong pages),
    the output still equals the reference over the original layout."""
    from dataclasses import replace

    batch = paged_batch(LENS, num_kv_heads=2, group=2, head_dim=64)
    budgets = torch.tensor(BUDGETS, dtype=torch.int32)
    selected = select_pages(batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets)
    expected = attention_reference(*decode_args(batch, selected))
    perm = torch.randperm(batch.k_cache.shape[0], generator=torch.Generator().manual_seed(1))
    k_moved, v_moved = torch.empty_like(batch.k_cache), torch.empty_like(batch.v_cache)
    k_moved[perm], v_moved[perm] = batch.k_cache, batch.v_cache  # page p now lives at perm[p]
    moved = replace(selected, physical_pages=perm[selected.physical_pages.long()].int())
    args = (batch.q, k_moved, v_moved, batch.page_table, batch.seq_lens, moved)
    out = decode_triton.paged_decode_triton(*args, 64**-0.5, num_splits=num_splits)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("group,head_dim", SHAPES)
def test_dense_kernel_equals_reference(paged_batch, group, head_dim):
    batch = paged_batch(LENS, num_kv_heads=2, group=group, head_dim=head_dim)
    out = paged_decode(*decode_args(batch), backend="triton")
    torch.testing.assert_close(
        out.double(), attention_reference(*decode_args(batch)), atol=1e-5, rtol=0
    )


def test_budget_at_least_pages_equals_dense_and_sdpa(paged_batch, sdpa_dense):
    batch = paged_batch(LENS, num_kv_heads=2, group=3, head_dim=64)
    budgets = torch.tensor([5, 9, 1 << 20, 3, 3], dtype=torch.int32)
    selected = select_pages(batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets)
    assert torch.equal(selected.num_selected, torch.tensor([5, 7, 1, 3, 1], dtype=torch.int32))
    sparse = paged_decode(*decode_args(batch, selected), backend="triton")
    dense = paged_decode(*decode_args(batch), backend="triton")
    torch.testing.assert_close(sparse, dense, atol=1e-6, rtol=0)
    torch.testing.assert_close(sparse, sdpa_dense(batch), atol=1e-5, rtol=0)
    torch.testing.assert_close(
        dense, paged_decode(*decode_args(batch), backend="torch"), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("page_size,pages_per_iter,num_splits", [(8, 2, 2), (32, 1, 8), (16, 4, 5)])
def test_other_page_sizes_tiles_and_empty_splits(
    paged_batch, page_size, pages_per_iter, num_splits
):
    batch = paged_batch([70, 9, 64], num_kv_heads=2, group=2, head_dim=64, page_size=page_size)
    budgets = torch.tensor([3, 3, 3], dtype=torch.int32)
    selected = select_pages(
        batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets, page_size=page_size
    )
    out = decode_triton.paged_decode_triton(
        *decode_args(batch, selected), 0.125, num_splits=num_splits, pages_per_iter=pages_per_iter
    )
    expected = attention_reference(*decode_args(batch, selected))
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)


def test_bf16_kernel_upcasts_under_interpreter(paged_batch):
    batch = paged_batch(LENS, num_kv_heads=2, group=4, head_dim=64, dtype=torch.bfloat16)
    out = paged_decode(*decode_args(batch), backend="triton")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(
        out.double(), attention_reference(*decode_args(batch)), atol=1e-2, rtol=0
    )


@pytest.mark.parametrize("score", ["quest", "centroid"])
@pytest.mark.parametrize("group,head_dim", [(1, 64), (8, 128)])
def test_score_kernel_equals_torch(paged_batch, score, group, head_dim):
    batch = paged_batch(LENS, num_kv_heads=2, group=group, head_dim=head_dim, strided_table=True)
    args = (batch.q, batch.summary, batch.page_table, batch.seq_lens, score, 16)
    torch_scores = page_scores_torch(*args)  # (B, H_kv, max_pages)
    triton_scores = score_triton.page_scores_triton(*args)
    in_use = torch.arange(torch_scores.shape[2]) < ((batch.seq_lens[:, None, None] + 15) // 16)
    torch.testing.assert_close(
        triton_scores[in_use.expand_as(torch_scores)],
        torch_scores[in_use.expand_as(torch_scores)],
        atol=1e-4,
        rtol=1e-5,
    )
    budgets = torch.tensor(BUDGETS, dtype=torch.int32)
    sel_args = (batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets)
    by_triton = select_pages(*sel_args, score=score, backend="triton")
    by_torch = select_pages(*sel_args, score=score, backend="torch")
    assert torch.equal(by_triton.logical_pages, by_torch.logical_pages)


def test_query_view_with_strided_heads(paged_batch):
    batch = paged_batch([40, 70], num_kv_heads=2, group=2, head_dim=64)
    q = torch.randn(2, 4, 3 * 64)[..., :64]  # (B, H_q, D) sliced out of a fused projection
    args = (q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens)
    expected = attention_reference(q.contiguous(), *args[1:])
    out = paged_decode(*args, backend="triton")
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("num_splits", [1, 3])  # 1: no merge, the split kernel writes the output
def test_qwen3_1p7b_heads_bf16_engine_inputs(paged_batch, close_to_magnitude, num_splits):
    """Group 2 (16 q / 8 KV heads, D 128), q as the engine's strided view of the rotated q/k
    tensor, Quest summaries in bf16 (min/max only): selection equals the loop reference, decode
    is within the bf16 bound of the float64 reference."""
    from sparrow.kernels.reference import select_pages_reference

    batch = paged_batch([70, 40], num_kv_heads=8, group=2, head_dim=128, dtype=torch.bfloat16)
    qk = torch.randn(2, 24, 128, generator=torch.Generator().manual_seed(3)).bfloat16()
    q = qk[:, :16]  # (B, H_q, D), row stride 24 * 128
    summary = type(batch.summary)(
        None, batch.summary.k_min.bfloat16(), batch.summary.k_max.bfloat16()
    )
    budgets = torch.tensor([3, 3], dtype=torch.int32)
    selected = select_pages(q, summary, batch.page_table, batch.seq_lens, budgets, backend="triton")
    counts = selected.num_selected.tolist()
    got = [[selected.logical_pages[b, h, : counts[b]].tolist() for h in range(8)] for b in range(2)]
    ref = select_pages_reference(
        q, summary, batch.page_table, batch.seq_lens, budgets, score="quest"
    )
    assert got == ref
    args = (q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens, selected)
    out = decode_triton.paged_decode_triton(*args, 128**-0.5, num_splits=num_splits)
    assert out.dtype == torch.bfloat16
    close_to_magnitude(out, attention_reference(q.contiguous(), *args[1:]), 2**-6)
