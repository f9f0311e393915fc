"""Page scoring and selection for block-sparse decode (Sparrow paper, docs/DESIGN.md §1).

Per (sequence, KV head): n = ceil(seq_len / page_size) pages. If n <= budget every page is kept
(the sequence is attended densely); otherwise the first `num_sink` pages (attention sink), the last
`num_recent` pages (recent window, including the partial page) and the top
(budget - num_sink - num_recent) other pages by score. Every KV head of a sequence keeps the same
number of pages but picks its own. Scores ("centroid", the paper's; "quest", Quest's bound) are
computed here in torch or by the Triton kernel in score_triton.py; the choice from scores is
torch here (`select_from_scores`) or one Triton kernel (select_triton.py), same pages.

A decode step builds a `SelectionPlan` once (`selection_plan`): everything selection needs that
does not depend on a layer's queries. Given the step's largest counts as host integers (an engine
knows them from its own bookkeeping, and may round them up so that shapes repeat), neither the
plan nor the per-layer choice reads a device value back: fixed shapes, no host sync, so the
step can be captured as a CUDA graph. Each layer then costs one top-k, a sort of the picks and
a few fixed-shape gathers (`select_from_scores`).
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from .paged_cache import PageSummary

SCORE_MODES = ("centroid", "quest")


@dataclass
class SelectedPages:
    """Pages each (sequence, KV head) attends to, padded to S slots (at least the batch's largest
    count). Padding slots hold logical page 0 and its physical page (valid ids, never attended)."""

    logical_pages: Tensor  # (B, H_kv, S) int32, ascending per row; past num_selected[b]: padding
    num_selected: Tensor  # (B,) int32, the same for every KV head of a sequence
    # (B, H_kv, S) int32 physical page of each slot, from the plan's page table; None when the
    # selection was made without one (training-time selection has no pages)
    physical_pages: Tensor | None = None


@dataclass
class SelectionPlan:
    """What selection needs from the page tables, lengths and budgets of one decode step: the same
    for every sparse layer of the step, so an engine builds it once (`selection_plan`)."""

    phys: Tensor  # (B, P) int64 physical page of each column in use, 0 past the length
    phys32: Tensor  # (B, P) int32 the same, which the kernels take
    distinct: Tensor | None  # (U,) distinct pages when samples share enough of them, else None
    column: Tensor | None  # (B, P) int64 index into `distinct` of each column
    num_selected: Tensor  # (B,) int32 pages kept per (sequence, KV head)
    max_selected: int  # S, slots of the output (>= every row's count)
    max_top: int  # K, pages taken by score (>= every row's count of them)
    candidate: Tensor  # (B, 1, P) bool pages eligible for the top-by-score choice
    drop_top: Tensor  # (B, 1, K) bool which of the top-K picks (by rank) a sequence drops
    from_top: Tensor  # (B, 1, S) bool slots filled by a top pick, in ascending page order
    fixed: Tensor  # (B, 1, S) int64 logical page of every other slot (sink, recent, dense, pad)
    top_slot: Tensor  # (S,) int64 index of a slot's pick among the ascending kept picks
    # (B * H_kv * P,) rows of a summary table viewed as (pages * H_kv, D) in (B, H_kv, P) order:
    # filled by the step's first torch scoring, then read by every other sparse layer.
    summary_rows: Tensor | None = None


def distinct_pages(page_table: Tensor, seq_lens: Tensor, page_size: int) -> tuple[Tensor, Tensor]:
    """(distinct (U,), column (B, P)) of the pages in use, for `selection_plan(shared=...)`.
    Data-dependent shapes (torch.unique): for CPU engines, before the forward, never on a GPU."""
    pages = torch.arange(page_table.shape[1], device=page_table.device)  # (P,)
    num_logical = (seq_lens.long() + page_size - 1) // page_size  # (B,)
    phys = torch.where(pages < num_logical[:, None], page_table.long(), 0)  # (B, P)
    return torch.unique(phys, return_inverse=True)


def selection_plan(
    page_table: Tensor,
    seq_lens: Tensor,
    budgets: Tensor,
    *,
    page_size: int,
    num_sink: int,
    num_recent: int,
    trim: bool = False,
    max_selected: int | None = None,
    max_top: int | None = None,
    shared: tuple[Tensor, Tensor] | None = None,
) -> SelectionPlan:
    """The step's selection inputs; page_table (B, P) int32, seq_lens (B,), budgets (B,).

    `max_selected`, `max_top`: upper bounds on any row's kept pages and pages chosen by score,
    known on the host (the engine's plan; it may round them up to buckets). With both given the
    plan costs no host sync and has shapes fixed by them and P. Without them they are read from
    the device (one sync), `trim` drops the columns past the longest sequence (a second sync), and
    when samples share their pages (distinct ids at most half the entries) scoring reads each
    distinct page's summary once (`distinct_pages`, data-dependent shapes). `shared`: that
    distinct-page split, computed by the caller ahead of a sync-free plan.
    """
    device = page_table.device
    synced = max_selected is None or max_top is None
    if trim and synced:
        page_table = page_table[:, : -(-int(seq_lens.max()) // page_size)]
    max_pages = page_table.shape[1]
    num_logical = (seq_lens.long() + page_size - 1) // page_size  # (B,)
    pages = torch.arange(max_pages, device=device)  # (P,)
    phys = torch.where(pages < num_logical[:, None], page_table.long(), 0)  # (B, P)
    budgets = budgets.long().to(device)  # (B,)
    sparse_row = num_logical > budgets  # (B,)
    num_selected = torch.where(sparse_row, budgets, num_logical)  # (B,)
    num_top = torch.where(sparse_row, budgets - num_sink - num_recent, 0)  # (B,)
    if max_selected is None or max_top is None:  # synced
        max_selected, max_top = torch.stack([num_selected.max(), num_top.max()]).tolist()
        if shared is None:
            distinct, column = torch.unique(phys, return_inverse=True)  # (U,), (B, P)
            if 2 * distinct.numel() <= phys.numel():
                shared = distinct, column
    max_top = min(max_top, max_pages)  # topk takes at most the row's columns
    n = num_logical[:, None, None]  # (B, 1, 1)
    slots = torch.arange(max_selected, device=device)  # (S,)
    from_top, fixed = _slot_layout(slots, num_logical, num_selected, num_top, sparse_row, num_sink)
    return SelectionPlan(
        phys=phys,
        phys32=phys.to(torch.int32),
        distinct=None if shared is None else shared[0],
        column=None if shared is None else shared[1],
        num_selected=num_selected.to(torch.int32),
        max_selected=max_selected,
        max_top=max_top,
        candidate=(pages >= num_sink) & (pages < n - num_recent),
        drop_top=torch.arange(max_top, device=device) >= num_top[:, None, None],
        from_top=from_top,
        fixed=fixed,
        top_slot=(slots - num_sink).clamp(0, max(max_top - 1, 0)),
    )


def _slot_layout(
    slots: Tensor,
    num_logical: Tensor,
    num_selected: Tensor,
    num_top: Tensor,
    sparse_row: Tensor,
    num_sink: int,
) -> tuple[Tensor, Tensor]:
    """(from_top, fixed), each (B, 1, S): which selection slots take a page chosen by score, and
    the logical page every other slot holds (0 for padding past num_selected).

    Slot layout of a sparse row: sink pages, its num_top picks in ascending order, the recent
    pages; a dense row holds its pages in order. The picks are the only per-layer part, so the
    rest is fixed here once per step."""
    n = num_logical[:, None, None]  # (B, 1, 1)
    top_end = (num_sink + num_top)[:, None, None]  # (B, 1, 1)
    sparse = sparse_row[:, None, None]  # (B, 1, 1)
    from_top = sparse & (slots >= num_sink) & (slots < top_end)  # (B, 1, S)
    recent = sparse & (slots >= top_end)  # (B, 1, S)
    fixed = torch.where(recent, n - num_selected[:, None, None] + slots, slots)  # (B, 1, S)
    fixed = torch.where(slots < num_selected[:, None, None], fixed, 0)  # padding -> page 0
    return from_top, fixed


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
    wanted = (summary.k_mean,) if score == "centroid" else (summary.k_max, summary.k_min)
    tables = [t for t in wanted if t is not None]
    assert len(tables) == len(wanted), f"{score} scoring reads its page summaries"

    if plan.distinct is not None and plan.column is not None:  # set together
        return _distinct_page_scores(q_groups, tables, plan.distinct, plan.column, score)
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


def _distinct_page_scores(
    q_groups: Tensor, tables: list[Tensor], distinct: Tensor, column: Tensor, score: str
) -> Tensor:
    """(B, H_kv, P) scores when rows share pages: each distinct page's summary (`distinct` (U,)
    physical ids) is read once and scored against every query of its KV head in one matmul,
    then indexed out per sequence through `column` (B, P), each column's index into `distinct`.
    q_groups: (B, H_kv, G, D); tables: the score mode's summaries, (pages, H_kv, D) each."""
    batch, num_kv_heads, _, head_dim = q_groups.shape
    num_distinct = distinct.numel()
    rows = [t.index_select(0, distinct).permute(1, 2, 0) for t in tables]  # (H_kv, D, U)
    queries = q_groups.transpose(0, 1).reshape(num_kv_heads, -1, head_dim)  # (H_kv, B*G, D)
    per_page = _score(queries, rows, score)  # (H_kv, B*G, U); G = 1 for centroid
    per_page = per_page.view(num_kv_heads, batch, -1, num_distinct).amax(dim=2)
    index = column[:, None, :].expand(batch, num_kv_heads, column.shape[1])  # (B, H_kv, P)
    return per_page.permute(1, 0, 2).gather(2, index)  # (B, H_kv, max_pages)


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
    `plan`: the step's `selection_plan` for these arguments, built here when None (one sync).

    Fixed shapes: the top-K picks by score are sorted by page and laid into the slots between
    the sink and the recent pages; the picks a row does not keep (rank >= its count) are moved
    past every page before the sort, so a row's kept picks come first. Same pages and order as
    marking the chosen pages in a (B, H_kv, P) mask and compacting it (the loop reference)."""
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
    shape = (batch, num_kv_heads, plan.max_selected)
    logical = plan.fixed.expand(shape)  # (B, H_kv, S)
    if plan.max_top > 0:
        masked = torch.where(plan.candidate, scores, float("-inf"))  # (B, H_kv, P)
        top_idx = masked.topk(plan.max_top, dim=-1).indices  # (B, H_kv, K), by rank
        kept = top_idx.masked_fill_(plan.drop_top, max_pages).sort(dim=-1).values  # ascending
        logical = torch.where(plan.from_top, kept[..., plan.top_slot], logical)  # (B, H_kv, S)
    physical = plan.phys32.gather(1, logical.reshape(batch, -1)).view(shape)  # (B, H_kv, S)
    return SelectedPages(
        logical_pages=logical.to(torch.int32),
        num_selected=plan.num_selected,
        physical_pages=physical,
    )
