"""Triton page choice: top-k by score, compaction into ascending slots and physical page ids, in
one launch per sparse layer (the torch path, selection.select_from_scores, is ~8 launches).

One program per (sequence, KV head) holds its row of page scores (padded to BLOCK_P) in
registers. The kept pages of a sparse row are the sink pages, the recent pages and the top
`budget - num_sink - num_recent` candidates by score; listed in ascending page order they are
exactly the slot layout of `select_from_scores` (sink, picks ascending, recent), so one prefix
sum over the keep mask places every page. The k-th largest score is found without sorting: a
32-step radix select over the scores' order-preserving integer keys (one count per bit), then
ties at the threshold go to the lowest pages. Rows with no more pages than their budget keep
every page; slots past a row's count hold logical page 0 and its physical page, as in torch.
Under TRITON_INTERPRET=1 (set before import) the kernel runs on CPU.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from .launch_checks import MAX_PAGES, check_select_pages  # noqa: F401  (the AOT list reads it)
from .selection import SelectedPages


@triton.jit
def _select_pages_kernel(
    scores_ptr, page_table_ptr, seq_lens_ptr, budgets_ptr, logical_ptr, physical_ptr,
    stride_sb, stride_sh, stride_ptb, stride_ptp, stride_lb, stride_lh,
    max_selected,
    PAGE_SIZE: tl.constexpr, NUM_SINK: tl.constexpr, NUM_RECENT: tl.constexpr,
    BLOCK_P: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    offs_p = tl.arange(0, BLOCK_P)  # (BLOCK_P,) logical pages, and output slots
    num_logical = tl.cdiv(tl.load(seq_lens_ptr + b), PAGE_SIZE)
    budget = tl.load(budgets_ptr + b)
    sparse = num_logical > budget  # a scalar: combined with the page masks through tl.where
    num_top = tl.where(sparse, budget - NUM_SINK - NUM_RECENT, 0)
    candidate_end = tl.where(sparse, num_logical - NUM_RECENT, 0)  # dense rows: no candidates
    candidate = (offs_p >= NUM_SINK) & (offs_p < candidate_end)
    score = tl.load(scores_ptr + b * stride_sb + kv_head * stride_sh + offs_p, mask=candidate)
    # Order-preserving key in [0, 2^32): flip the magnitude bits of negative floats, then shift
    # the signed range up; non-candidates get -1, below every candidate.
    bits = score.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64) + 2147483648
    key = tl.where(candidate, key, -1)
    # Radix select: the largest threshold with at least num_top keys at or above it is the
    # num_top-th largest key.
    threshold = tl.zeros([], dtype=tl.int64)
    for bit in tl.static_range(31, -1, -1):
        trial = threshold | (1 << bit)
        count = tl.sum((key >= trial).to(tl.int32), axis=0)
        threshold = tl.where(count >= num_top, trial, threshold)
    above = key > threshold
    ties = key == threshold
    ties_needed = num_top - tl.sum(above.to(tl.int32), axis=0)
    tie_rank = tl.cumsum(ties.to(tl.int32), axis=0)  # 1-based among the ties, lowest page first
    # num_top = 0 ends with the top threshold and no ties needed: no picks.
    top = candidate & (above | (ties & (tie_rank <= ties_needed)))
    in_row = offs_p < num_logical
    fixed = (offs_p < tl.where(sparse, NUM_SINK, num_logical)) | (offs_p >= candidate_end)
    keep = in_row & (fixed | top)
    slot = tl.cumsum(keep.to(tl.int32), axis=0) - 1  # ascending pages -> slots 0, 1, ...
    table = page_table_ptr + b * stride_ptb
    phys = tl.load(table + offs_p * stride_ptp, mask=keep, other=0)
    out = b * stride_lb + kv_head * stride_lh
    tl.store(logical_ptr + out + slot, offs_p, mask=keep)
    tl.store(physical_ptr + out + slot, phys, mask=keep)
    # Padding slots: logical page 0 and its physical page (valid ids, never attended).
    pad = (offs_p >= tl.sum(keep.to(tl.int32), axis=0)) & (offs_p < max_selected)
    first = tl.load(table) + tl.zeros([BLOCK_P], dtype=tl.int32)
    tl.store(logical_ptr + out + offs_p, tl.zeros([BLOCK_P], dtype=tl.int32), mask=pad)
    tl.store(physical_ptr + out + offs_p, first, mask=pad)


# TRITON_INTERPRET was read when the kernel above was decorated.
INTERPRETED = type(_select_pages_kernel).__name__ == "InterpretedFunction"


def select_pages_triton(
    scores: Tensor,
    page_table: Tensor,
    seq_lens: Tensor,
    budgets: Tensor,
    num_selected: Tensor,
    max_selected: int,
    *,
    page_size: int,
    num_sink: int,
    num_recent: int,
) -> SelectedPages:
    """scores (B, H_kv, P) fp32 (columns past a row's pages ignored), page_table (B, P) int32,
    seq_lens, budgets (B,) int32, num_selected (B,) int32 (the step plan's, returned as is),
    max_selected: slots S (>= every row's count) -> SelectedPages with physical ids."""
    check_select_pages(scores, page_table, seq_lens, budgets, max_selected)
    batch, num_kv_heads, max_pages = scores.shape
    if not scores.is_cuda and not INTERPRETED:
        raise RuntimeError(
            "select_pages(triton) needs CUDA, or TRITON_INTERPRET=1 set before "
            "sparrow.kernels.select_triton is imported"
        )
    shape = (batch, num_kv_heads, max_selected)
    logical = torch.empty(shape, dtype=torch.int32, device=scores.device)  # (B, H_kv, S)
    physical = torch.empty(shape, dtype=torch.int32, device=scores.device)  # (B, H_kv, S)
    constexprs = select_constexprs(page_size, num_sink, num_recent, max(max_pages, max_selected))
    _select_pages_kernel[(batch, num_kv_heads)](
        scores, page_table, seq_lens, budgets, logical, physical,
        scores.stride(0), scores.stride(1), page_table.stride(0), page_table.stride(1),
        logical.stride(0), logical.stride(1),
        max_selected,
        **constexprs, num_warps=select_num_warps(constexprs["BLOCK_P"]),
    )  # fmt: skip
    return SelectedPages(logical_pages=logical, num_selected=num_selected, physical_pages=physical)


def select_constexprs(page_size: int, num_sink: int, num_recent: int, width: int) -> dict:
    """The kernel's constexprs for rows of `width` pages (and output slots): one function for the
    launcher and the AOT variant list (one variant per power of 2 up to MAX_PAGES)."""
    return {"PAGE_SIZE": page_size, "NUM_SINK": num_sink, "NUM_RECENT": num_recent,
            "BLOCK_P": max(16, triton.next_power_of_2(width))}  # fmt: skip


def select_num_warps(block_p: int) -> int:
    """Warps for a row of `block_p` pages: up to 8 keys per thread (16 spilled 16 bytes at 4,096
    pages and 8 warps with Triton 3.6, the GPU image's; 32 warps would cap a thread at 64
    registers)."""
    return max(4, min(16, block_p // (32 * 8)))


def aot_signature(kernel: str, dtype: str, constexprs: dict) -> dict[str, str]:
    """Argument types of the kernel for ahead-of-time compilation (kernels/aot.py)."""
    types = {name: "i32" for name in _select_pages_kernel.arg_names if name.startswith("stride")}
    types |= {"scores_ptr": "*fp32", "max_selected": "i32"}
    return types | {name: "*i32" for name in ("page_table_ptr", "seq_lens_ptr", "budgets_ptr",
                                              "logical_ptr", "physical_ptr")}  # fmt: skip
