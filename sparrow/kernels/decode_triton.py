"""Triton paged block-sparse decode: split-KV flash-decoding over selected pages.

Pass 1: one program per (sequence, KV head, split) takes the whole GQA query group (padded to 16
rows for tl.dot), walks its share of the selected pages PAGES_PER_ITER pages at a time with an fp32
online softmax, and writes a normalised partial output and its log-sum-exp (base 2). The walk is
pipelined by hand, two deep: each tile's page ids are loaded once (one sel -> page_table gather per
page, not per token lane) two iterations ahead, and the next tile's K/V loads are issued before
the current tile is computed. Pass 2 merges the splits of each (sequence, query head) by
log-sum-exp; with one split (`choose_num_splits`: the rows alone fill the GPU, or rows too short
to split) pass 1 writes the output directly and pass 2 is skipped. Dense decode is the same kernel
with every page selected (DENSE skips the selection table). Under TRITON_INTERPRET=1 (CPU tests)
keys and values are upcast to fp32 because the interpreter's bf16 arithmetic is wrong; the env var
is read when this module is imported, so set it before.
"""

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from .launch_checks import check_decode_tiling
from .selection import SelectedPages


@triton.jit
def _page_ids(sel_base, phys_base, stride_ss, table_base, stride_ptp, start, hi, offs_p,
              DENSE: tl.constexpr):  # fmt: skip
    """(logical, physical int64 id, in range) of the pages in slots start + offs_p: one load per
    page, not per token lane. Slots at or past `hi` get page 0, so no lane forms a wild address.
    Sparse: both ids come from the selection (two independent loads, no sel -> page_table chain);
    dense: slot i is logical page i, its physical id from the page table."""
    slot = start + offs_p  # (PAGES_PER_ITER,)
    slot_ok = slot < hi
    if DENSE:
        logical = tl.where(slot_ok, slot, 0)
        phys = tl.load(table_base + logical * stride_ptp, mask=slot_ok, other=0)
    else:
        logical = tl.load(sel_base + slot * stride_ss, mask=slot_ok, other=0)
        phys = tl.load(phys_base + slot * stride_ss, mask=slot_ok, other=0)
    return logical, phys.to(tl.int64), slot_ok  # int64: large caches overflow int32 offsets


@triton.jit
def _load_tile(
    k_base, v_base, stride_kp, stride_kt, stride_vp, stride_vt, ids, seq_len, offs_t, offs_d,
    PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """K and V (BLOCK_N, HEAD_DIM) of the pages `ids` and which of their token rows are valid."""
    logical, phys, slot_ok = ids
    BLOCK_N: tl.constexpr = logical.shape[0] * PAGE_SIZE
    pos = logical[:, None] * PAGE_SIZE + offs_t[None, :]  # (PAGES_PER_ITER, PAGE_SIZE)
    tok_ok = tl.reshape(slot_ok[:, None] & (pos < seq_len), [BLOCK_N])  # (BLOCK_N,)
    # Row offsets are multiples of HEAD_DIM (contiguous caches, checked by the launcher):
    # saying so lets the compiler issue 16-byte vector loads.
    row_k = tl.reshape(phys[:, None] * stride_kp + offs_t[None, :] * stride_kt, [BLOCK_N])
    row_v = tl.reshape(phys[:, None] * stride_vp + offs_t[None, :] * stride_vt, [BLOCK_N])
    row_k = tl.multiple_of(row_k, HEAD_DIM)
    row_v = tl.multiple_of(row_v, HEAD_DIM)
    k = tl.load(k_base + row_k[:, None] + offs_d[None, :], mask=tok_ok[:, None], other=0.0)
    v = tl.load(v_base + row_v[:, None] + offs_d[None, :], mask=tok_ok[:, None], other=0.0)
    return k, v, tok_ok


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, page_table_ptr, seq_lens_ptr, sel_ptr, sel_phys_ptr, num_sel_ptr,
    o_ptr, lse_ptr,
    scale_log2,
    stride_qb, stride_qh,
    stride_kp, stride_kt, stride_kh,
    stride_vp, stride_vt, stride_vh,
    stride_ptb, stride_ptp,
    stride_sb, stride_sh, stride_ss,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh,
    num_splits,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr, PAGES_PER_ITER: tl.constexpr, DENSE: tl.constexpr,
    SPLIT_OUT: tl.constexpr,
    COMPUTE_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    if DENSE:
        num_sel = tl.cdiv(seq_len, PAGE_SIZE)
    else:
        num_sel = tl.load(num_sel_ptr + b)
    # Splits divide this sequence's own pages (whole iterations each), so a short sequence in a
    # batch of long ones still spreads over every split, and the host needs no page count.
    pages_per_split = tl.cdiv(tl.cdiv(num_sel, num_splits), PAGES_PER_ITER) * PAGES_PER_ITER
    lo = split * pages_per_split
    hi = tl.minimum(lo + pages_per_split, num_sel)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_p = tl.arange(0, PAGES_PER_ITER)  # (PAGES_PER_ITER,) pages of one iteration
    offs_t = tl.arange(0, PAGE_SIZE)  # (PAGE_SIZE,) token offsets within a page
    g_mask = offs_g < GROUP
    q_heads = kv_head * GROUP + offs_g  # (GROUP_PAD,)
    q = tl.load(
        q_ptr + b * stride_qb + q_heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None],
        other=0.0,
    )  # (GROUP_PAD, HEAD_DIM)
    if COMPUTE_FP32:
        q = q.to(tl.float32)
    k_base = k_ptr + kv_head * tl.multiple_of(stride_kh, HEAD_DIM)
    v_base = v_ptr + kv_head * tl.multiple_of(stride_vh, HEAD_DIM)
    sel_base = sel_ptr + b * stride_sb + kv_head * stride_sh
    phys_base = sel_phys_ptr + b * stride_sb + kv_head * stride_sh
    table_base = page_table_ptr + b * stride_ptb

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    # Two-deep software pipeline: while one tile is computed, the next tile's K/V loads are in
    # flight (their addresses came from ids loaded an iteration earlier) and the ids of the tile
    # after it are loading, so no iteration waits on the dependent sel -> page_table -> K chain.
    ids = _page_ids(sel_base, phys_base, stride_ss, table_base, stride_ptp, lo, hi, offs_p,
                    DENSE)  # fmt: skip
    k, v, tok_ok = _load_tile(k_base, v_base, stride_kp, stride_kt, stride_vp, stride_vt, ids,
                              seq_len, offs_t, offs_d, PAGE_SIZE, HEAD_DIM)  # fmt: skip
    ids = _page_ids(sel_base, phys_base, stride_ss, table_base, stride_ptp, lo + PAGES_PER_ITER,
                    hi, offs_p, DENSE)  # fmt: skip
    for start in range(lo, hi, PAGES_PER_ITER):
        k_next, v_next, tok_ok_next = _load_tile(
            k_base, v_base, stride_kp, stride_kt, stride_vp, stride_vt, ids, seq_len, offs_t,
            offs_d, PAGE_SIZE, HEAD_DIM,
        )  # fmt: skip
        ids = _page_ids(sel_base, phys_base, stride_ss, table_base, stride_ptp,
                        start + 2 * PAGES_PER_ITER, hi, offs_p, DENSE)  # fmt: skip
        if COMPUTE_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # (G_PAD, BLOCK_N)
        s = tl.where(tok_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: each iteration has a valid token
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])  # (GROUP_PAD, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
        k, v, tok_ok = k_next, v_next, tok_ok_next

    # An empty split (past this sequence's pages) reports lse = -inf so the merge weighs it 0.
    has_tokens = l_i > 0
    out = acc / tl.where(has_tokens, l_i, 1.0)[:, None]
    o_rows = o_ptr + b * stride_ob + split * stride_os + q_heads[:, None] * stride_oh
    tl.store(o_rows + offs_d[None, :], out.to(o_ptr.dtype.element_ty), mask=g_mask[:, None])
    if SPLIT_OUT:
        lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + b * stride_lb + q_heads * stride_lh + split, lse, mask=g_mask)


# TRITON_INTERPRET was read when the kernel above was decorated; this is what the launcher and
# the tests need to know (and it does not depend on the Triton version's config API).
INTERPRETED = type(_decode_split_kernel).__name__ == "InterpretedFunction"


@triton.jit
def _merge_splits_kernel(
    o_ptr, lse_ptr, out_ptr, num_splits,
    stride_ob, stride_oh, stride_os,
    stride_lb, stride_lh,
    stride_outb, stride_outh,
    HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    s_mask = offs_s < num_splits
    lse = tl.load(
        lse_ptr + b * stride_lb + head * stride_lh + offs_s, mask=s_mask, other=float("-inf")
    )
    weight = tl.exp2(lse - tl.max(lse, axis=0))  # (SPLITS_PAD,); split 0 is never empty
    o = tl.load(
        o_ptr + b * stride_ob + head * stride_oh + offs_s[:, None] * stride_os + offs_d[None, :],
        mask=s_mask[:, None],
        other=0.0,
    )  # (SPLITS_PAD, HEAD_DIM)
    out = tl.sum(o * weight[:, None], axis=0) / tl.sum(weight, axis=0)
    tl.store(
        out_ptr + b * stride_outb + head * stride_outh + offs_d, out.to(out_ptr.dtype.element_ty)
    )


@dataclass(frozen=True)
class DecodeTiles:
    """Tile and launch configuration of the split kernel."""

    pages_per_iter: int  # pages per loop iteration (BLOCK_N = pages_per_iter * PAGE_SIZE)
    num_warps: int
    num_stages: int


# Compiled GPUs: the largest tiles whose two-deep pipeline (both K/V tiles in registers) does not
# spill at head dim 128 (`sparrow-bench kernel --aot`): 32 tokens x 4 warps in bf16/fp16, 16
# tokens x 8 warps in fp32 (its 32-token tiles spill).
DEFAULT_TILES = DecodeTiles(pages_per_iter=2, num_warps=4, num_stages=2)
FP32_TILES = DecodeTiles(pages_per_iter=1, num_warps=8, num_stages=2)
INTERPRETER_TILES = DecodeTiles(pages_per_iter=1, num_warps=4, num_stages=2)
MAX_SPLITS = 32  # the merge kernel reads every split of a head in one tile
MIN_ITERS_PER_SPLIT = 4  # below this, a split's prologue and the merge outweigh the parallelism


def default_tiles(dtype: torch.dtype, interpreted: bool = False) -> DecodeTiles:
    """The tiles the launcher uses unless told otherwise."""
    if interpreted:
        return INTERPRETER_TILES
    return FP32_TILES if dtype == torch.float32 else DEFAULT_TILES


def decode_constexprs(
    group: int, head_dim: int, page_size: int, dtype: torch.dtype, tiles: DecodeTiles,
    *, dense: bool, split_out: bool, interpreted: bool = False,
) -> dict:  # fmt: skip
    """The split kernel's constexprs for these shapes: one function for the launcher and the
    ahead-of-time variant list, so that both name the same compiled kernels."""
    fp32 = dtype == torch.float32
    return {
        "GROUP": group, "GROUP_PAD": max(16, triton.next_power_of_2(group)),
        "HEAD_DIM": head_dim, "PAGE_SIZE": page_size,
        # tl.dot needs N >= 16 tokens per iteration.
        "PAGES_PER_ITER": max(tiles.pages_per_iter, triton.cdiv(16, page_size)),
        "DENSE": dense, "SPLIT_OUT": split_out, "COMPUTE_FP32": interpreted or fp32,
        "DOT_PRECISION": "ieee" if fp32 or interpreted else "tf32",
    }  # fmt: skip


def choose_num_splits(
    num_rows: int, max_pages: int, pages_per_iter: int, num_sms: int, ctas_per_sm: int
) -> int:
    """Splits per (sequence, KV head) row: enough programs for one full wave of resident CTAs
    (`num_sms` x `ctas_per_sm`, from the kernel's registers and shared memory), but no split with
    fewer than MIN_ITERS_PER_SPLIT iterations of the longest row (`max_pages`, an upper bound
    known without a device sync), and 1 when the rows alone fill the wave (no merge then)."""
    resident = num_sms * max(1, ctas_per_sm)
    if num_rows >= resident:
        return 1
    iters = triton.cdiv(max(1, max_pages), pages_per_iter)
    by_length = max(1, iters // MIN_ITERS_PER_SPLIT)
    return max(1, min(triton.cdiv(resident, num_rows), by_length, MAX_SPLITS))


def ctas_per_sm(regs: int, smem_bytes: int, num_warps: int, *, regs_per_sm: int = 65536,
                smem_per_sm: int = 228 * 1024, max_warps: int = 64) -> int:  # fmt: skip
    """Resident CTAs of a kernel per SM (Hopper limits by default), from what ptxas reports."""
    by_regs = regs_per_sm // max(1, regs * 32 * num_warps)
    by_smem = smem_per_sm // max(1, smem_bytes)
    return max(1, min(by_regs, by_smem, max_warps // num_warps))


def paged_decode_triton(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    page_table: Tensor,
    seq_lens: Tensor,
    selected: SelectedPages | None,
    scale: float,
    *,
    num_splits: int | None = None,
    pages_per_iter: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> Tensor:
    """Launch the split kernel, and the merge when there is more than one split; inputs already
    validated by checks.py. The keyword-only knobs are for tests and the benchmark sweep; None
    picks the default tiles and the split count from the device, the kernel and the shapes."""
    batch, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    if not q.is_cuda and not INTERPRETED:
        raise RuntimeError(
            "paged_decode(backend='triton') on CPU needs TRITON_INTERPRET=1 set before "
            "sparrow.kernels.decode_triton is imported"
        )
    check_decode_tiling(head_dim, page_size)
    tiles = _launch_tiles(q.dtype, pages_per_iter, num_warps, num_stages)
    # An upper bound on any row's page count that needs no device sync.
    max_slots = page_table.shape[1] if selected is None else selected.logical_pages.shape[2]
    kw = dict(dense=selected is None, interpreted=INTERPRETED)
    num_splits = _clamped_num_splits(
        q, num_splits, batch * num_kv_heads, max_slots, group, page_size, tiles, kw
    )
    split_out = num_splits > 1
    constexprs = decode_constexprs(
        group, head_dim, page_size, q.dtype, tiles, split_out=split_out, **kw
    )
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (B, H_q, D), contiguous
    o_part, lse_part, o_strides, lse_strides = _split_buffers(out, num_splits)
    sel, sel_phys, num_sel = _selection_args(selected, page_table, seq_lens)
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, page_table, seq_lens, sel, sel_phys, num_sel, o_part, lse_part,
        scale * math.log2(math.e),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        page_table.stride(0), page_table.stride(1),
        sel.stride(0), sel.stride(1), sel.stride(2),
        *o_strides, *lse_strides,
        num_splits,
        **constexprs, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    if split_out:
        _merge_splits(o_part, lse_part, out)
    return out


def _launch_tiles(
    dtype: torch.dtype, pages_per_iter: int | None, num_warps: int | None, num_stages: int | None
) -> DecodeTiles:
    """The default tiles for `dtype`, with whichever knobs the caller (a test, the benchmark's
    sweep) set in their place."""
    base = default_tiles(dtype, INTERPRETED)
    return DecodeTiles(
        pages_per_iter=pages_per_iter or base.pages_per_iter,
        num_warps=num_warps or base.num_warps,
        num_stages=num_stages or base.num_stages,
    )


def _clamped_num_splits(q, requested, num_rows, max_slots, group, page_size, tiles, kw) -> int:
    """`requested` (None: the device's default) clamped to what the launch can use: at most
    MAX_SPLITS (the merge reads every split of a head in one tile) and no more splits than the
    longest row has iterations (a split past every row's pages would only be merged away)."""
    if requested is None:
        requested = _default_num_splits(q, num_rows, max_slots, group, page_size, tiles, kw)
    head_dim = q.shape[-1]
    constexprs = decode_constexprs(group, head_dim, page_size, q.dtype, tiles, split_out=True, **kw)
    ppi = constexprs["PAGES_PER_ITER"]
    return max(1, min(requested, MAX_SPLITS, triton.cdiv(max_slots, ppi)))


def _split_buffers(out: Tensor, num_splits: int) -> tuple[Tensor, Tensor, tuple, tuple]:
    """(o_part, lse_part, o_strides, lse_strides) the split kernel writes: fp32 partial outputs
    and log-sum-exps for the merge, or with one split `out` itself (the kernel's normalised
    output is final, written in q's dtype; the lse is never stored)."""
    batch, num_q_heads, head_dim = out.shape
    if num_splits == 1:
        return out, out, (out.stride(0), out.stride(1), 0), (0, 0)
    o_part = torch.empty(batch, num_q_heads, num_splits, head_dim, device=out.device)
    lse_part = torch.empty(batch, num_q_heads, num_splits, device=out.device)
    return o_part, lse_part, o_part.stride()[:3], lse_part.stride()[:2]


def _selection_args(
    selected: SelectedPages | None, page_table: Tensor, seq_lens: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The kernel's (sel, sel_phys, num_sel) arguments. Dense mode never reads the selection
    pointers: page_table stands in for them, and each row's page count comes from seq_lens."""
    if selected is None:
        placeholder = page_table[:, None, :]
        return placeholder, placeholder, seq_lens
    sel, sel_phys = _selected_ids(selected, page_table)
    return sel, sel_phys, selected.num_selected


def _merge_splits(o_part: Tensor, lse_part: Tensor, out: Tensor) -> None:
    """Pass 2: one program per (sequence, query head) merges its splits into `out`."""
    batch, num_q_heads, num_splits, head_dim = o_part.shape
    _merge_splits_kernel[(batch, num_q_heads)](
        o_part, lse_part, out, num_splits,
        o_part.stride(0), o_part.stride(1), o_part.stride(2),
        lse_part.stride(0), lse_part.stride(1),
        out.stride(0), out.stride(1),
        **merge_constexprs(head_dim),
    )  # fmt: skip


def _selected_ids(selected: SelectedPages, page_table: Tensor) -> tuple[Tensor, Tensor]:
    """(logical, physical) ids (B, H_kv, S) int32 of the selected slots in one layout (the kernel
    reads both with one set of strides). The engine's selection emits the physical ids; a
    selection made without a page table gets them here from one gather."""
    logical = selected.logical_pages
    phys = selected.physical_pages
    if phys is None:
        batch, heads, slots = logical.shape
        # Padding slots (past num_selected, never read) may hold any value: clamp for the gather.
        rows = logical.reshape(batch, heads * slots).long().clamp(0, page_table.shape[1] - 1)
        phys = page_table.gather(1, rows).view(batch, heads, slots)
    if phys.shape != logical.shape:
        raise ValueError(
            f"paged_decode(triton): selected physical pages {tuple(phys.shape)} != logical "
            f"{tuple(logical.shape)}"
        )
    if phys.stride() != logical.stride():
        logical, phys = logical.contiguous(), phys.contiguous()
    return logical, phys.to(torch.int32)


def merge_constexprs(head_dim: int) -> dict:
    """The merge kernel's constexprs (one variant per head dim and output dtype)."""
    return {"HEAD_DIM": head_dim, "SPLITS_PAD": MAX_SPLITS}


_OCCUPANCY: dict[tuple, int] = {}  # compiled variant -> resident CTAs per SM


def _default_num_splits(q, num_rows, max_slots, group, page_size, tiles, kw) -> int:
    """choose_num_splits on this device with the compiled kernel's occupancy; 1 in the
    interpreter, where programs run one after another anyway."""
    if not q.is_cuda:
        return 1
    head_dim = q.shape[-1]
    constexprs = decode_constexprs(group, head_dim, page_size, q.dtype, tiles, split_out=True, **kw)
    key = (q.device, q.dtype, tiles, tuple(sorted(constexprs.items())))
    if key not in _OCCUPANCY:
        regs, smem = _compiled_resources(q, constexprs, tiles)
        _OCCUPANCY[key] = ctas_per_sm(regs, smem, tiles.num_warps)
    num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    return choose_num_splits(
        num_rows, max_slots, constexprs["PAGES_PER_ITER"], num_sms, _OCCUPANCY[key]
    )


def _compiled_resources(q: Tensor, constexprs: dict, tiles: DecodeTiles) -> tuple[int, int]:
    """(registers per thread, shared bytes) of the split kernel variant, compiled (and cached by
    Triton) through a warmup with dummy arguments of the right types."""
    ints = [16] * 19  # strides and num_splits: multiples of 16, as the real ones mostly are
    i32 = torch.zeros(1, dtype=torch.int32, device=q.device)
    f32 = torch.zeros(1, dtype=torch.float32, device=q.device)
    try:
        compiled = _decode_split_kernel.warmup(
            q, q, q, i32, i32, i32, i32, i32, f32, f32, 1.0, *ints,
            **constexprs, num_warps=tiles.num_warps, num_stages=tiles.num_stages, grid=(1,),
        )  # fmt: skip
        compiled._init_handles()
        return compiled.n_regs, compiled.metadata.shared
    except Exception:  # a Triton version without warmup: assume a register-bound kernel
        return 255, 0


def aot_signature(kernel: str, dtype: str, constexprs: dict) -> dict[str, str]:
    """Argument types of `kernel` for ahead-of-time compilation (kernels/aot.py)."""
    if kernel == "merge_splits":
        types = {
            name: "i32" for name in _merge_splits_kernel.arg_names if name.startswith("stride")
        }
        return types | {
            "o_ptr": "*fp32",
            "lse_ptr": "*fp32",
            "out_ptr": f"*{dtype}",
            "num_splits": "i32",
        }
    # One split: the output is final (q's dtype), and the launcher passes it as the unread
    # lse_ptr too.
    out = "*fp32" if constexprs["SPLIT_OUT"] else f"*{dtype}"
    types = {name: "i32" for name in _decode_split_kernel.arg_names if name.startswith("stride")}
    types |= {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "v_ptr": f"*{dtype}"}
    types |= {
        name: "*i32"
        for name in ("page_table_ptr", "seq_lens_ptr", "sel_ptr", "sel_phys_ptr", "num_sel_ptr")
    }
    types |= {"o_ptr": out, "lse_ptr": out, "scale_log2": "fp32", "num_splits": "i32"}
    return types
