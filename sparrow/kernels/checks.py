"""Argument checks shared by the public kernel ops, run before any backend touches memory.

A Triton kernel given an out-of-range page id reads (or, in the interpreter, segfaults on) memory
it does not own, so every id the kernel will dereference is checked on the host first. The value
checks cost one device sync; callers that replay a fixed batch (e.g. CUDA graphs) can skip them.
"""

import torch
from torch import Tensor

from .paged_cache import PageSummary
from .selection import SCORE_MODES, SelectedPages

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_decode_inputs(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    page_table: Tensor,
    seq_lens: Tensor,
    selected: SelectedPages | None,
    check_values: bool,
) -> None:
    """Raise ValueError/TypeError with a one-line reason if paged_decode's inputs are malformed."""
    if q.dim() != 3:
        raise ValueError(f"paged_decode: q must be (B, H_q, D), got shape {tuple(q.shape)}")
    if k_cache.dim() != 4:
        raise ValueError(
            "paged_decode: k_cache must be (num_pages, PAGE_SIZE, H_kv, D), got "
            f"{tuple(k_cache.shape)}"
        )
    if v_cache.shape != k_cache.shape:
        raise ValueError(
            f"paged_decode: v_cache shape {tuple(v_cache.shape)} != k_cache {tuple(k_cache.shape)}"
        )
    batch, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, cache_dim = k_cache.shape
    if cache_dim != head_dim:
        raise ValueError(f"paged_decode: q head dim {head_dim} != cache head dim {cache_dim}")
    if num_q_heads % num_kv_heads != 0:
        raise ValueError(
            f"paged_decode: H_q={num_q_heads} is not a multiple of H_kv={num_kv_heads} (GQA)"
        )
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"paged_decode: {name} must be fp16/bf16/fp32, got {t.dtype}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(
            f"paged_decode: q, k_cache, v_cache dtypes differ: {q.dtype}, {k_cache.dtype}, "
            f"{v_cache.dtype}"
        )
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("paged_decode: k_cache and v_cache must be contiguous")
    if q.stride(-1) != 1:
        raise ValueError(f"paged_decode: q's last dim must have stride 1, strides are {q.stride()}")
    _check_index(page_table, "page_table", 2, batch)
    _check_index(seq_lens, "seq_lens", 1, batch)
    devices = {t.device for t in (q, k_cache, v_cache, page_table, seq_lens)}
    if selected is not None:
        _check_index(selected.logical_pages, "selected.logical_pages", 3, batch)
        _check_index(selected.num_selected, "selected.num_selected", 1, batch)
        if selected.logical_pages.shape[1] != num_kv_heads:
            raise ValueError(
                f"paged_decode: selected.logical_pages must be (B, H_kv={num_kv_heads}, S), got "
                f"{tuple(selected.logical_pages.shape)}"
            )
        devices |= {selected.logical_pages.device, selected.num_selected.device}
    if len(devices) != 1:
        raise ValueError(f"paged_decode: all tensors must be on one device, got {devices}")
    if check_values:
        _check_decode_values(k_cache.shape[0], page_size, page_table, seq_lens, selected)


def check_select_inputs(
    q: Tensor,
    summary: PageSummary,
    page_table: Tensor,
    seq_lens: Tensor,
    budgets: Tensor,
    score: str,
    page_size: int,
    num_sink: int,
    num_recent: int,
    check_values: bool,
) -> None:
    """Raise ValueError/TypeError with a one-line reason if select_pages' inputs are malformed."""
    if score not in SCORE_MODES:
        raise ValueError(f"select_pages: score must be one of {SCORE_MODES}, got {score!r}")
    if q.dim() != 3 or q.dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"select_pages: q must be float (B, H_q, D), got {tuple(q.shape)} {q.dtype}"
        )
    if q.stride(-1) != 1:
        raise ValueError(f"select_pages: q's last dim must have stride 1, strides are {q.stride()}")
    wanted = (summary.k_min, summary.k_max) if score == "quest" else (summary.k_mean,)
    tables = [t for t in wanted if t is not None]
    if len(tables) < len(wanted):
        raise ValueError(f"select_pages: {score} scoring needs the page summaries it reads")
    num_pages, num_kv_heads, head_dim = tables[0].shape
    if {t.device for t in tables} != {q.device}:
        raise ValueError("select_pages: page summaries must be on q's device")
    if any(t.dtype not in (torch.float32, q.dtype) for t in tables):
        raise TypeError(f"select_pages: page summaries must be fp32 or q's dtype {q.dtype}")
    if q.shape[1] % num_kv_heads != 0 or q.shape[2] != head_dim:
        raise ValueError(
            f"select_pages: q {tuple(q.shape)} does not match summaries (H_kv={num_kv_heads}, "
            f"D={head_dim}); H_q must be a multiple of H_kv"
        )
    batch = q.shape[0]
    _check_index(page_table, "page_table", 2, batch)
    _check_index(seq_lens, "seq_lens", 1, batch)
    _check_index(budgets, "budgets", 1, batch)
    if num_sink < 1 or num_recent < 1 or page_size < 1:
        raise ValueError("select_pages: num_sink, num_recent and page_size must be >= 1")
    if not check_values:
        return
    _check_decode_values(num_pages, page_size, page_table, seq_lens, None)
    if int(budgets.min()) < num_sink + num_recent:
        raise ValueError(
            f"select_pages: every budget must be >= num_sink + num_recent = {num_sink + num_recent}"
            f" pages, got min {int(budgets.min())}"
        )


def _check_index(t: Tensor, name: str, dims: int, batch: int) -> None:
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.dim() != dims or t.shape[0] != batch:
        raise ValueError(
            f"{name} must have {dims} dims with batch {batch} first, got {tuple(t.shape)}"
        )


def _check_decode_values(
    num_pages: int,
    page_size: int,
    page_table: Tensor,
    seq_lens: Tensor,
    selected: SelectedPages | None,
) -> None:
    max_pages = page_table.shape[1]
    lens = seq_lens.long()  # (B,)
    num_logical = (lens + page_size - 1) // page_size  # (B,)
    in_use = torch.arange(max_pages, device=lens.device) < num_logical[:, None]  # (B, max_pages)
    bad_page = in_use & ((page_table < 0) | (page_table >= num_pages))  # (B, max_pages)
    flags = [(lens < 1).any(), (num_logical > max_pages).any(), bad_page.any()]
    if selected is not None:
        logical = selected.logical_pages  # (B, H_kv, S)
        count = selected.num_selected.long()  # (B,)
        slots = torch.arange(logical.shape[2], device=lens.device)  # (S,)
        live = slots < count[:, None, None]  # (B, 1, S)
        bad_logical = live & ((logical < 0) | (logical >= num_logical[:, None, None]))
        bad_count = (count < 1) | (count > logical.shape[2]) | (count > num_logical)
        flags += [bad_count.any(), bad_logical.any()]
        phys = selected.physical_pages  # (B, H_kv, S) or None; the Triton kernel reads them
        bad_phys = torch.zeros((), dtype=torch.bool, device=lens.device)
        if phys is not None:
            bad_phys = (live & ((phys < 0) | (phys >= num_pages))).any()
        flags.append(bad_phys)
    flags = torch.stack(flags).tolist()  # one host sync for every value check
    if flags[0]:
        raise ValueError(f"seq_lens must be >= 1, got {seq_lens.tolist()}")
    if flags[1]:
        raise ValueError(
            f"seq_lens need up to {int(num_logical.max())} pages but page_table has "
            f"{max_pages} columns"
        )
    if flags[2]:
        b, p = (int(i) for i in bad_page.nonzero()[0])
        raise ValueError(
            f"page_table[{b}, {p}] = {int(page_table[b, p])} is out of range [0, {num_pages})"
        )
    if selected is not None and flags[3]:
        raise ValueError(
            "selected.num_selected must lie in [1, min(pages of the sequence, S)], got "
            f"{selected.num_selected.tolist()}"
        )
    if selected is not None and flags[4]:
        b, h, s = (int(i) for i in bad_logical.nonzero()[0])
        raise ValueError(
            f"selected.logical_pages[{b}, {h}, {s}] = {int(selected.logical_pages[b, h, s])} is "
            f"outside the sequence's {int(num_logical[b])} pages"
        )
    if selected is not None and flags[5]:
        raise ValueError(f"selected.physical_pages has ids outside [0, {num_pages})")
