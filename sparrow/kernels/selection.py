"""Page scoring and selection for block-sparse decode (Sparrow paper, docs/DESIGN.md §1).

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


@dataclass
class SelectionPlan:
    """What selection needs from the page tables, lengths and budgets of one decode step: the same
    for every sparse layer of the step, so an engine builds it once (`selection_plan`)."""

    phys: Tensor  # (B, P) int64 physical page of each column in use, 0 past the length
    distinct: Tensor | None  # (U,) distinct pages when samples share enough of them, else None
    column: Tensor | None  # (B, P) int64 index into `distinct` of each column
    num_selected: Tensor  # (B,) int64 pages kept per (sequence, KV head)
    num_top: Tensor  # (B,) int64 of those chosen by score
    max_selected: int
    max_top: int
    candidate: Tensor  # (B, 1, P) bool pages eligible for the top-by-score choice
    always: Tensor  # (B, 1, P) bool pages kept regardless of score (sink, recent, dense rows)
    keep_top: Tensor  # (B, 1, max_top) bool which of the top-max_top a sequence keeps
    # (B * H_kv * P,) rows of a summary table viewed as (pages * H_kv, D) in (B, H_kv, P) order:
    # filled by the step's first torch scoring, then read by every other sparse layer.
    summary_rows: Tensor | None = None


def selection_plan(
    page_table: Tensor,
    seq_lens: Tensor,
    budgets: Tensor,
    *,
    page_size: int,
    num_sink: int,
    num_recent: int,
    trim: bool = False,
) -> SelectionPlan:
    """The step's selection inputs; page_table (B, P) int32, seq_lens (B,), budgets (B,).
    `trim` drops the columns past the longest sequence (engines may pad page tables to the
    longest possible one; scoring cost should follow the batch's actual context)."""
    device = page_table.device
    if trim:
        page_table = page_table[:, : -(-int(seq_lens.max()) // page_size)]
    max_pages = page_table.shape[1]
    num_logical = (seq_lens.long() + page_size - 1) // page_size  # (B,)
    pages = torch.arange(max_pages, device=device)  # (P,)
    phys = torch.where(pages < num_logical[:, None], page_table.long(), 0)  # (B, P)
    # The n samples of a prompt share its pages: when the distinct pages are at most half the
    # entries, scoring reads each distinct page's summary once (see page_scores_torch).
    distinct, column = torch.unique(phys, return_inverse=True)  # (U,), (B, P)
    if 2 * distinct.numel() > phys.numel():
        distinct, column = None, None
    budgets = budgets.long().to(device)  # (B,)
    sparse_row = num_logical > budgets  # (B,)
    num_selected = torch.where(sparse_row, budgets, num_logical)  # (B,)
    num_top = torch.where(sparse_row, budgets - num_sink - num_recent, 0)  # (B,)
    max_selected, max_top = torch.stack([num_selected.max(), num_top.max()]).tolist()
    n = num_logical[:, None, None]  # (B, 1, 1)
    forced = (pages < num_sink) | ((pages >= n - num_recent) & (pages < n))  # (B, 1, P)
    dense = (pages < n) & ~sparse_row[:, None, None]  # (B, 1, P)
    return SelectionPlan(
        phys=phys,
        distinct=distinct,
        column=column,
        num_selected=num_selected,
        num_top=num_top,
        max_selected=max_selected,
        max_top=max_top,
        candidate=(pages >= num_sink) & (pages < n - num_recent),
        always=(forced & sparse_row[:, None, None]) | dense,
        keep_top=torch.arange(max_top, device=device) < num_top[:, None, None],
    )


def page_scores_torch(
    q: Tensor,
    summary: PageSummary,
    page_table: Tensor,
    seq_lens: Tensor,
    score: str,
    page_size: int,
    plan: SelectionPlan | None = None,
) -> Tensor:
    """Score every logical page column of `page_table` for each (sequence, KV head).

    Returns (B, H_kv, max_pages) fp32; columns at or past a sequence's page count hold garbage
    (they are masked by `select_from_scores`). Quest's bound sum_d max(q_d*min_d, q_d*max_d) is
    split as relu(q).max + min(q, 0).min so that it becomes two batched matmuls; it is taken per
    query head and then maxed over the GQA group (the bound for the group's best head).

    With samples sharing a prompt (`plan.distinct`), each distinct page's summary is read once
    and scored against every query (one matmul per KV head), and the scores are indexed out per
    sequence: reading the summaries, not the arithmetic, is the cost on CPU. `plan`: the step's
    `selection_plan` (budgets do not matter here); built from the arguments when None.
    """
    if score not in SCORE_MODES:
        raise ValueError(f"score must be one of {SCORE_MODES}, got {score!r}")
    if plan is None:
        no_budget = torch.zeros_like(seq_lens)
        plan = selection_plan(
            page_table, seq_lens, no_budget, page_size=page_size, num_sink=0, num_recent=0
        )
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = summary.num_kv_heads
    group = num_q_heads // num_kv_heads
    max_pages = plan.phys.shape[1]
    q_groups = q.float().reshape(batch, num_kv_heads, group, head_dim)  # (B, H_kv, G, D)
    if score == "centroid":
        q_groups = q_groups.mean(dim=2, keepdim=True)  # (B, H_kv, 1, D)
    tables = (summary.k_mean,) if score == "centroid" else (summary.k_max, summary.k_min)

    if plan.distinct is not None:
        num_distinct = plan.distinct.numel()
        rows = [t.index_select(0, plan.distinct).permute(1, 2, 0) for t in tables]  # (H_kv, D, U)
        queries = q_groups.transpose(0, 1).reshape(num_kv_heads, -1, head_dim)  # (H_kv, B*G, D)
        per_page = _score(queries, rows, score)  # (H_kv, B*G, U); G = 1 for centroid
        per_page = per_page.view(num_kv_heads, batch, -1, num_distinct).amax(dim=2)
        index = plan.column[:, None, :].expand(batch, num_kv_heads, max_pages)  # (B, H_kv, P)
        return per_page.permute(1, 0, 2).gather(2, index)  # (B, H_kv, max_pages)
    # Gather (page, head) rows of each table viewed as (pages * H_kv, D), in (B, H_kv, P) order:
    # the result is contiguous (B, H_kv, P, D), one matrix per (sequence, head), which bmm takes
    # as it is. Gathering whole pages gives (B, P, H_kv, D) instead, and matmul then copies it
    # (B and H_kv do not fold into one batch dim). At 4K context x 8 rows, 2 threads, that copy
    # took 12 of scoring's 24 ms per decode step; this layout took a step from 130 to 119 ms.
    if plan.summary_rows is None:
        heads = torch.arange(num_kv_heads, device=q.device)
        plan.summary_rows = (plan.phys[:, None, :] * num_kv_heads + heads[:, None]).reshape(-1)
    shape = (batch, num_kv_heads, max_pages, head_dim)
    per_head = [
        t.reshape(-1, head_dim).index_select(0, plan.summary_rows).view(shape).transpose(-1, -2)
        for t in tables
    ]  # (B, H_kv, D, max_pages) views of contiguous (B, H_kv, max_pages, D)
    return _score(q_groups, per_head, score).amax(dim=2)  # (B, H_kv, max_pages)


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
    plan: SelectionPlan | None = None,
) -> SelectedPages:
    """Apply the selection rule to page scores (B, H_kv, max_pages); vectorised over the batch.
    `plan`: the step's `selection_plan` for these arguments, built here when None."""
    batch, num_kv_heads, max_pages = scores.shape
    device = scores.device
    if plan is None:
        table = torch.zeros(batch, max_pages, dtype=torch.int64, device=device)  # ids unused
        plan = selection_plan(
            table,
            seq_lens.to(device),
            budgets,
            page_size=page_size,
            num_sink=num_sink,
            num_recent=num_recent,
        )
    chosen = torch.zeros(batch, num_kv_heads, max_pages, dtype=torch.bool, device=device)
    if plan.max_top > 0:
        masked = torch.where(plan.candidate, scores.float(), float("-inf"))  # (B, H_kv, P)
        top_idx = masked.topk(plan.max_top, dim=-1).indices  # (B, H_kv, K), distinct per row
        chosen.scatter_(2, top_idx, plan.keep_top.expand_as(top_idx))
    chosen |= plan.always

    # Compact each row's chosen pages to the front in ascending order: a chosen page's slot is the
    # number of chosen pages before it; unchosen pages are written to a discarded extra column.
    max_selected = plan.max_selected
    pages = torch.arange(max_pages, device=device)  # (P,)
    slot = torch.where(chosen, chosen.long().cumsum(dim=-1) - 1, max_selected)  # (B, H_kv, P)
    out = torch.zeros(batch, num_kv_heads, max_selected + 1, dtype=torch.long, device=device)
    out.scatter_(2, slot, pages.expand(batch, num_kv_heads, max_pages))
    return SelectedPages(
        logical_pages=out[..., :max_selected].to(torch.int32).contiguous(),
        num_selected=plan.num_selected.to(torch.int32),
    )
