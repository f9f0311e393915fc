"""The shape, stride, dtype and device rules of each Triton launcher, without Triton.

A launcher (`*_triton.py`) calls its check before it allocates or launches anything; the fake
implementation of its torch op (ops.py) calls the same check before it allocates the outputs'
shapes. So a rehearsal on fake tensors, where no kernel runs, rejects exactly what the launcher
would, and this module imports nothing but torch. Whether a kernel can run at all (CUDA, or the
interpreter) is the launcher's own check: it depends on how Triton was imported.
"""

import torch
from torch import Tensor

from .paged_cache import PageSummary
from .selection import SCORE_MODES

HALF_DTYPES = (torch.float16, torch.bfloat16)
# Row kernels (add_rms_norm, silu_mul) address element `row * stride + column` in int32 (their
# strides are i32 in the ahead-of-time signatures, kernels/aot.py): the last element must fit.
INT32_MAX = 2**31 - 1

# A row of scores lives in one program's registers (select_triton.py): 8K pages (128K tokens at
# page 16) is the widest that compiles without spills for sm_90 (16K spills at 16 warps); wider
# rows take the torch choice (kernels.select_pages).
MAX_PAGES = 8192


def check_one_device(op: str, *tensors: Tensor | None) -> None:
    """A kernel reads every pointer on one device: a CPU tensor handed to a compiled kernel
    would be read as device memory."""
    devices = {t.device for t in tensors if t is not None}
    if len(devices) > 1:
        names = sorted(map(str, devices))
        raise ValueError(f"{op}: all tensors must be on one device, got {names}")


def check_decode_tiling(head_dim: int, page_size: int) -> None:
    """paged_decode(triton)'s tiles: a power-of-2 head dim >= 16 (tl.dot) and page size."""
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(
            f"paged_decode(triton): head dim must be a power of 2 >= 16, got {head_dim}"
        )
    if page_size & (page_size - 1):
        raise ValueError(f"paged_decode(triton): PAGE_SIZE must be a power of 2, got {page_size}")


def check_page_scores(q: Tensor, summary: PageSummary, score: str) -> list[Tensor]:
    """page_scores_triton's inputs; returns the summary tables `score` reads (quest: min, max)."""
    if score not in SCORE_MODES:
        raise ValueError(f"score must be one of {SCORE_MODES}, got {score!r}")
    head_dim = q.shape[-1]
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(
            f"select_pages(triton): head dim must be a power of 2 >= 16, got {head_dim}"
        )
    tables = [summary.k_min, summary.k_max] if score == "quest" else [summary.k_mean]
    for table in tables:
        if (
            table is None
            or not table.is_contiguous()
            or table.dtype not in (q.dtype, torch.float32)
        ):
            raise ValueError(
                f"select_pages(triton): {score} scoring needs contiguous page summaries in fp32 "
                f"or q's dtype {q.dtype}"
            )
    check_one_device("select_pages(triton)", q, *tables)
    return [t for t in tables if t is not None]  # all of them: a None raised above


def check_select_pages(
    scores: Tensor, page_table: Tensor, seq_lens: Tensor, budgets: Tensor, max_selected: int
) -> None:
    """select_pages_triton's inputs: scores (B, H_kv, P) fp32, int32 page_table (B, P), seq_lens
    and budgets (B,), at most MAX_PAGES pages and slots per row."""
    batch, _, max_pages = scores.shape
    if scores.dtype != torch.float32 or scores.stride(-1) != 1:
        raise ValueError("select_pages(triton): scores must be fp32 with unit last stride")
    if page_table.shape != (batch, max_pages) or page_table.dtype != torch.int32:
        raise ValueError(
            f"select_pages(triton): page_table must be int32 (B, P) = {(batch, max_pages)}, got "
            f"{page_table.dtype} {tuple(page_table.shape)}"
        )
    for name, t in (("seq_lens", seq_lens), ("budgets", budgets)):
        if t.shape != (batch,) or t.dtype != torch.int32:
            raise ValueError(f"select_pages(triton): {name} must be int32 (B,) = ({batch},)")
    if max(max_pages, max_selected) > MAX_PAGES:
        raise ValueError(
            f"select_pages(triton): at most {MAX_PAGES} pages and slots per row, got "
            f"{max_pages} pages, {max_selected} slots"
        )
    check_one_device("select_pages(triton)", scores, page_table, seq_lens, budgets)


def check_write_kv(
    k_cache: Tensor,
    v_cache: Tensor,
    k: Tensor,
    v: Tensor,
    slot_mapping: Tensor,
    summary: PageSummary | None,
) -> None:
    """kv_write_triton.write_kv's inputs (see its docstring)."""
    num_pages, page_size, num_kv_heads, head_dim = k_cache.shape
    expected = (slot_mapping.shape[0], num_kv_heads, head_dim)
    if tuple(k.shape) != expected or tuple(v.shape) != expected or slot_mapping.dim() != 1:
        raise ValueError(
            f"write_kv(triton): k, v must be (N, H_kv, D) = {expected} with slot_mapping (N,); "
            f"got k {tuple(k.shape)}, v {tuple(v.shape)}, slot_mapping {tuple(slot_mapping.shape)}"
        )
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("write_kv(triton): k and v need a unit last stride")
    if v_cache.shape != k_cache.shape or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("write_kv(triton): k_cache and v_cache must be contiguous, same shape")
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"write_kv(triton): slot_mapping must be int32/int64: {slot_mapping.dtype}")
    if head_dim & (head_dim - 1) or page_size & (page_size - 1):
        raise ValueError(
            f"write_kv(triton): head dim and PAGE_SIZE must be powers of 2: {head_dim}, {page_size}"
        )
    tables = [] if summary is None else summary.tables
    if any(t.shape != (num_pages, num_kv_heads, head_dim) or not t.is_contiguous() for t in tables):
        raise ValueError("write_kv(triton): summary tables must be contiguous (num_pages, H_kv, D)")
    check_one_device("write_kv(triton)", k_cache, v_cache, k, v, slot_mapping, *tables)


def check_add_rms_norm(x: Tensor, weight: Tensor, residual: Tensor | None) -> None:
    """norm_rope_triton.add_rms_norm's inputs: fp16/bf16 rows (N, C), weight (C,)."""
    _check_rows(x, "x")
    n_cols = x.shape[1]
    if weight.shape != (n_cols,) or not weight.is_contiguous():
        raise ValueError(f"add_rms_norm: weight must be contiguous ({n_cols},)")
    if residual is not None:
        _check_rows(residual, "residual")
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError("add_rms_norm: residual must match x's shape and dtype")
    check_one_device("add_rms_norm", x, weight, residual)


def check_qk_norm_rope(qk: Tensor, weight: Tensor | None, cos: Tensor, sin: Tensor) -> None:
    """norm_rope_triton.qk_norm_rope's inputs: qk (N, H, D), weight (H, D) or None, cos and sin
    (N, 1, D) in qk's dtype."""
    if qk.dim() != 3 or qk.stride(-1) != 1:
        raise ValueError(
            f"qk_norm_rope: qk must be (N, H, D) with unit last stride, got {qk.shape}"
        )
    n, heads, head_dim = qk.shape
    if weight is not None and (weight.shape != (heads, head_dim) or not weight.is_contiguous()):
        raise ValueError(f"qk_norm_rope: weight must be contiguous ({heads}, {head_dim})")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape != (n, 1, head_dim) or t.stride(-1) != 1 or t.dtype != qk.dtype:
            raise ValueError(f"qk_norm_rope: {name} must be (N, 1, D) in qk's dtype")
    if head_dim & (head_dim - 1) or head_dim < 2:
        raise ValueError(f"qk_norm_rope: head dim must be a power of 2, got {head_dim}")
    check_one_device("qk_norm_rope", qk, weight, cos, sin)


def check_silu_mul(gate_up: Tensor) -> None:
    """swiglu_triton.silu_mul's input: gate_up (N, 2 I) fp16/bf16/fp32, unit last stride."""
    if gate_up.dim() != 2 or gate_up.stride(-1) != 1 or gate_up.shape[1] % 2:
        raise ValueError(
            f"silu_mul: gate_up must be (N, 2 I) with unit last stride, got {tuple(gate_up.shape)}"
        )
    if gate_up.dtype not in (*HALF_DTYPES, torch.float32):
        raise TypeError(f"silu_mul: gate_up must be fp16/bf16/fp32, got {gate_up.dtype}")
    _check_row_offsets(gate_up, "silu_mul: gate_up")


def _check_rows(t: Tensor, name: str) -> None:
    if t.dim() != 2 or t.stride(-1) != 1 or t.dtype not in HALF_DTYPES:
        raise ValueError(
            f"add_rms_norm: {name} must be fp16/bf16 (N, C) with unit last stride, got "
            f"{tuple(t.shape)} {t.dtype}"
        )
    _check_row_offsets(t, f"add_rms_norm: {name}")


def _check_row_offsets(t: Tensor, name: str) -> None:
    """Rows (N, C) at any row stride >= 0 (a view of wider rows is read in place; the kernel
    takes the stride), as long as the last element's int32 offset does not overflow."""
    rows, cols = t.shape
    if rows and (rows - 1) * t.stride(0) + cols - 1 > INT32_MAX:
        raise ValueError(
            f"{name}: the last element's offset ({rows} rows at stride {t.stride(0)}) exceeds "
            "int32; split the rows into calls"
        )
