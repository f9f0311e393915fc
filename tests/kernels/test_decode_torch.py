"""Vectorised torch paged decode against the loop reference and against plain SDPA."""

import pytest
import torch

from sparrow.kernels import paged_decode, select_pages
from sparrow.kernels.reference import attention_reference

LENS = [70, 100, 16, 33, 1]  # 5, 7, 1, 3, 1 pages: partial and exact last pages, one token
BUDGETS = [3, 5, 4, 8, 3]  # sparse, sparse, dense (1 page), dense (budget > pages), dense


@pytest.mark.parametrize("group,head_dim", [(1, 64), (3, 64), (4, 128), (8, 128)])
@pytest.mark.parametrize("score", ["quest", "centroid"])
def test_sparse_equals_reference(paged_batch, poison_unselected, group, head_dim, score):
    batch = paged_batch(LENS, num_kv_heads=2, group=group, head_dim=head_dim, strided_table=True)
    budgets = torch.tensor(BUDGETS, dtype=torch.int32)
    selected = select_pages(
        batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets, score=score
    )
    poison_unselected(batch, selected.logical_pages, selected.num_selected)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens, selected)
    out = paged_decode(*args, backend="torch")
    assert out.shape == batch.q.shape and out.dtype == batch.q.dtype
    torch.testing.assert_close(out.double(), attention_reference(*args), atol=1e-5, rtol=0)


@pytest.mark.parametrize("group,head_dim", [(1, 128), (4, 64)])
def test_dense_and_full_budget_equal_sdpa(paged_batch, sdpa_dense, group, head_dim):
    batch = paged_batch(LENS, num_kv_heads=2, group=group, head_dim=head_dim)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens)
    budgets = torch.full((len(LENS),), 64, dtype=torch.int32)
    selected = select_pages(batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets)
    expected = sdpa_dense(batch)
    torch.testing.assert_close(paged_decode(*args, backend="torch"), expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        paged_decode(*args, selected, backend="torch"), expected, atol=1e-5, rtol=0
    )


def test_bf16_cache_matches_reference(paged_batch):
    batch = paged_batch(LENS, num_kv_heads=2, group=3, head_dim=64, dtype=torch.bfloat16)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens)
    out = paged_decode(*args)  # auto on CPU = torch
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), attention_reference(*args), atol=1e-2, rtol=0)


def test_custom_scale(paged_batch):
    batch = paged_batch([40, 9], num_kv_heads=1, group=2, head_dim=64)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens)
    out = paged_decode(*args, scale=0.3)
    torch.testing.assert_close(
        out.double(), attention_reference(*args, scale=0.3), atol=1e-5, rtol=0
    )
    assert not torch.allclose(out, paged_decode(*args), atol=1e-3)


def test_query_view_with_strided_heads(paged_batch):
    """q sliced out of a fused projection: last dim contiguous, heads strided."""
    batch = paged_batch([40, 70], num_kv_heads=2, group=2, head_dim=64)
    fused = torch.randn(2, 4, 3 * 64)
    q = fused[..., :64]  # (B, H_q, D), stride (768, 192, 1)
    args = (q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens)
    budgets = torch.tensor([3, 3], dtype=torch.int32)
    selected = select_pages(q, batch.summary, batch.page_table, batch.seq_lens, budgets)
    expected = attention_reference(q.contiguous(), *args[1:], selected)
    torch.testing.assert_close(paged_decode(*args, selected).double(), expected, atol=1e-5, rtol=0)
