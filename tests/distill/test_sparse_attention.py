"""The training-time page selection against the kernels' loop reference, query by query."""

import pytest
import torch

from sparrow.distill.attention_reference import selected_key_mask
from sparrow.distill.sparse_attention import SparseForwardMetadata, query_budgets
from sparrow.kernels import PageSummary
from sparrow.kernels.reference import select_pages_reference
from sparrow.rollout.paged_attention import SparseAttentionConfig


def test_query_budgets_shift_to_the_predicting_position():
    budget_pages = torch.tensor([[0, 0, 0, 2, 3, 3, 0]])  # (1, 7): prompt of 3, 4 tokens
    completion = budget_pages > 0
    got = query_budgets(budget_pages, completion, page_size=2)
    # Queries 0-1 and the last two predict no sparse token: dense = ceil((t + 1) / 2) pages.
    assert got.tolist() == [[1, 1, 2, 3, 3, 3, 4]]


def _summary(keys: torch.Tensor, page_size: int) -> PageSummary:
    """keys (H_kv, T, D) -> summary rows per full page, by hand."""
    pages = keys.shape[1] // page_size
    blocks = keys[:, : pages * page_size].unflatten(1, (pages, page_size))  # (H_kv, P, PAGE, D)
    return PageSummary(
        k_mean=blocks.mean(2).transpose(0, 1),
        k_min=blocks.amin(2).transpose(0, 1),
        k_max=blocks.amax(2).transpose(0, 1),
    )


@pytest.mark.parametrize("score", ["quest", "centroid"])
def test_mask_matches_loop_reference(score):
    torch.manual_seed(0)
    batch, num_q_heads, num_kv_heads, seq_len, head_dim, ps = 2, 6, 2, 27, 8, 3
    q = torch.randn(batch, num_q_heads, seq_len, head_dim)
    k = torch.randn(batch, num_kv_heads, seq_len, head_dim)
    budgets = torch.randint(3, 7, (batch, seq_len))  # (B, T) some >= the page count: dense
    attn = SparseAttentionConfig(page_size=ps, score=score)
    mask = selected_key_mask(q, k, SparseForwardMetadata(attn, budgets))  # (B, H_kv, T, T)

    num_sparse = 0
    for b in range(batch):
        summary = _summary(k[b], ps)
        table = torch.arange(-(-seq_len // ps))[None].int()  # identity page table
        for t in range(seq_len):
            pages = select_pages_reference(
                q[b, :, t][None], summary, table, torch.tensor([t + 1]), budgets[b, t : t + 1],
                score=score, page_size=ps, num_sink=1, num_recent=2,
            )[0]  # fmt: skip
            num_sparse += budgets[b, t] < -(-(t + 1) // ps)
            for h in range(num_kv_heads):
                expected = torch.zeros(seq_len, dtype=torch.bool)
                for p in pages[h]:
                    expected[p * ps : min((p + 1) * ps, t + 1)] = True
                assert torch.equal(mask[b, h, t], expected), (b, h, t)
    assert num_sparse > 20  # the comparison covered queries that really drop pages
