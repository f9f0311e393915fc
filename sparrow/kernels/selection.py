"""Page scoring and selection for block-sparse decode (Sparrow paper, DESIGN.md §1).

Per (sequence, KV head): n = ceil(seq_len / page_size) pages. If n <= budget every page is kept
(the sequence is attended densely); otherwise the first `num_sink` pages (attention sink), the last
`num_recent` pages (recent window, including the partial page) and the top
(budget - num_sink - num_recent) other pages by score. Every KV head of a sequence keeps the same
number of pages but picks its own. Scores ("centroid", the paper's; "quest", Quest's bound) are
computed here in torch or by the Triton kernel in score_triton.py; the choice from scores is torch.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from .paged_cache import PageSummary

SCORE_MODES = ("centroid", "quest")


@dataclass
class SelectedPages:
    """Pages each (sequence, KV head) attends to, padded to the batch's largest count S."""

    logical_pages: Tensor  # (B, H_kv, S) int32, ascending per row; past num_selected[b]: padding
    num_selected: Tensor  # (B,) int32, the same for every KV head of a sequence


def page_scores_torch(
    q: Tensor,
    summary: PageSummary,
    page_table: Tensor,
    seq_lens: Tensor,
    score: str,
    page_size: int,
) -> Tensor:
    """Score every logical page column of `page_table` for each (sequence, KV head).

    Returns (B, H_kv, max_pages) fp32; columns at or past a sequence's page count hold garbage
    (they are masked by `select_from_scores`). Quest's bound sum_d max(q_d*min_d, q_d*max_d) is
    split as relu(q).max + min(q, 0).min so that it becomes two batched matmuls; it is taken per
    query head and then maxed over the GQA group (the bound for the group's best head).

    The n samples of a prompt share its pages, so when the batch's distinct pages are at most
    half its page-table entries, each distinct page's summary is read once and scored against
    every query (one matmul per KV head), and the scores are then indexed out per sequence:
    reading the summaries, not the arithmetic, is the cost on CPU.
    """
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = summary.k_mean.shape[1]
    group = num_q_heads // num_kv_heads
    max_pages = page_table.shape[1]
    num_logical = (seq_lens.long() + page_size - 1) // page_size  # (B,)
    in_use = torch.arange(max_pages, device=q.device)[None, :] < num_logical[:, None]
    phys = torch.where(in_use, page_table.long(), 0)  # (B, max_pages)
    q_groups = q.float().reshape(batch, num_kv_heads, group, head_dim)  # (B, H_kv, G, D)
    if score not in SCORE_MODES:
        raise ValueError(f"score must be one of {SCORE_MODES}, got {score!r}")
    if score == "centroid":
        q_groups = q_groups.mean(dim=2, keepdim=True)  # (B, H_kv, 1, D)
    tables = (summary.k_mean,) if score == "centroid" else (summary.k_max, summary.k_min)

    distinct, column = torch.unique(phys, return_inverse=True)  # (U,), (B, max_pages)
    if 2 * distinct.numel() <= phys.numel():
        rows = [t.index_select(0, distinct).permute(1, 2, 0) for t in tables]  # (H_kv, D, U)
        queries = q_groups.transpose(0, 1).reshape(num_kv_heads, -1, head_dim)  # (H_kv, B*G, D)
        per_page = _score(queries, rows, score)  # (H_kv, B*G, U); G = 1 for centroid
        per_page = per_page.view(num_kv_heads, batch, -1, distinct.numel()).amax(dim=2)
        index = column[:, None, :].expand(batch, num_kv_heads, max_pages)  # (B, H_kv, P)
        return per_page.permute(1, 0, 2).gather(2, index)  # (B, H_kv, max_pages)
    phys = phys.reshape(-1)  # (B * max_pages,)
    rows = [
        t.index_select(0, phys).view(batch, max_pages, num_kv_heads, head_dim).permute(0, 2, 3, 1)
        for t in tables
    ]  # (B, H_kv, D, max_pages)
    return _score(q_groups, rows, score).amax(dim=2)  # (B, H_kv, max_pages)


def _score(queries: Tensor, tables: list[Tensor], score: str) -> Tensor:
    """(..., M, D) queries against (..., D, N) summaries -> (..., M, N) scores."""
    if score == "centroid":
        return torch.matmul(queries, tables[0])
    bound = torch.matmul(queries.clamp(min=0), tables[0])  # k_max
    bound += torch.matmul(queries.clamp(max=0), tables[1])  # k_min
    return bound


def select_from_scores(
    scores: Tensor,
    seq_lens: Tensor,
    budgets: Tensor,
    *,
    page_size: int,
    num_sink: int,
    num_recent: int,
) -> SelectedPages:
    """Apply the selection rule to page scores (B, H_kv, max_pages); vectorised over the batch."""
    batch, num_kv_heads, max_pages = scores.shape
    device = scores.device
    num_logical = (seq_lens.long() + page_size - 1) // page_size  # (B,)
    budgets = budgets.long().to(device)  # (B,)
    sparse_row = num_logical > budgets  # (B,)
    num_selected = torch.where(sparse_row, budgets, num_logical)  # (B,)
    num_top = torch.where(sparse_row, budgets - num_sink - num_recent, 0)  # (B,)
    max_selected, max_top = torch.stack([num_selected.max(), num_top.max()]).tolist()

    pages = torch.arange(max_pages, device=device)  # (P,)
    n = num_logical[:, None, None]  # (B, 1, 1)
    forced = (pages < num_sink) | ((pages >= n - num_recent) & (pages < n))  # (B, 1, P)
    chosen = torch.zeros(batch, num_kv_heads, max_pages, dtype=torch.bool, device=device)
    if max_top > 0:
        candidate = (pages >= num_sink) & (pages < n - num_recent)  # (B, 1, P)
        masked = torch.where(candidate, scores.float(), float("-inf"))  # (B, H_kv, P)
        top_idx = masked.topk(max_top, dim=-1).indices  # (B, H_kv, K), distinct per row
        keep = torch.arange(max_top, device=device) < num_top[:, None, None]  # (B, 1, K)
        chosen.scatter_(2, top_idx, keep.expand_as(top_idx))
    dense = (pages < n) & ~sparse_row[:, None, None]  # (B, 1, P)
    chosen |= (forced & sparse_row[:, None, None]) | dense

    # Compact each row's chosen pages to the front in ascending order: a chosen page's slot is the
    # number of chosen pages before it; unchosen pages are written to a discarded extra column.
    slot = torch.where(chosen, chosen.long().cumsum(dim=-1) - 1, max_selected)  # (B, H_kv, P)
    out = torch.zeros(batch, num_kv_heads, max_selected + 1, dtype=torch.long, device=device)
    out.scatter_(2, slot, pages.expand(batch, num_kv_heads, max_pages))
    return SelectedPages(
        logical_pages=out[..., :max_selected].to(torch.int32).contiguous(),
        num_selected=num_selected.to(torch.int32),
    )
