"""Triton paged block-sparse decode: split-KV flash-decoding over selected pages.

Pass 1: one program per (sequence, KV head, split) takes the whole GQA query group (padded to 16
rows for tl.dot), walks its share of the selected pages PAGES_PER_ITER pages at a time with an fp32
online softmax, and writes a normalised partial output and its log-sum-exp (base 2). Pass 2 merges
the splits of each (sequence, query head) by log-sum-exp. Dense decode is the same kernel with
every page selected (DENSE skips the selection table). Under TRITON_INTERPRET=1 (CPU tests) keys
and values are upcast to fp32 because the interpreter's bf16 arithmetic is wrong; the env var is
read when this module is imported, so set it before.
"""

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .selection import SelectedPages


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, page_table_ptr, seq_lens_ptr, sel_ptr, num_sel_ptr, o_ptr, lse_ptr,
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

    BLOCK_N: tl.constexpr = PAGES_PER_ITER * PAGE_SIZE
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    page_of_lane = offs_n // PAGE_SIZE  # (BLOCK_N,) which page of the iteration each lane reads
    token_of_lane = offs_n % PAGE_SIZE
    g_mask = offs_g < GROUP
    q_heads = kv_head * GROUP + offs_g  # (GROUP_PAD,)
    q = tl.load(
        q_ptr + b * stride_qb + q_heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None],
        other=0.0,
    )  # (GROUP_PAD, HEAD_DIM)
    if COMPUTE_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    for start in range(lo, hi, PAGES_PER_ITER):
        slot = start + page_of_lane  # (BLOCK_N,)
        slot_ok = slot < hi
        slot = tl.where(slot_ok, slot, 0)  # masked lanes point at page 0: never out of bounds
        if DENSE:
            logical = slot
        else:
            logical = tl.load(
                sel_ptr + b * stride_sb + kv_head * stride_sh + slot * stride_ss,
                mask=slot_ok,
                other=0,
            )
        phys = tl.load(
            page_table_ptr + b * stride_ptb + logical * stride_ptp, mask=slot_ok, other=0
        )
        phys = phys.to(tl.int64)  # large caches overflow int32 offsets
        tok_ok = slot_ok & (logical * PAGE_SIZE + token_of_lane < seq_len)  # (BLOCK_N,)
        k = tl.load(
            k_ptr
            + phys[:, None] * stride_kp
            + token_of_lane[:, None] * stride_kt
            + kv_head * stride_kh
            + offs_d[None, :],
            mask=tok_ok[:, None],
            other=0.0,
        )  # (BLOCK_N, HEAD_DIM)
        v = tl.load(
            v_ptr
            + phys[:, None] * stride_vp
            + token_of_lane[:, None] * stride_vt
            + kv_head * stride_vh
            + offs_d[None, :],
            mask=tok_ok[:, None],
            other=0.0,
        )  # (BLOCK_N, HEAD_DIM)
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

    # An empty split (past this sequence's pages) reports lse = -inf so the merge weighs it 0.
    has_tokens = l_i > 0
    out = acc / tl.where(has_tokens, l_i, 1.0)[:, None]
    lse = tl.where(has_tokens, m_i + tl.log2(tl.where(has_tokens, l_i, 1.0)), float("-inf"))
    o_base = o_ptr + b * stride_ob + split * stride_os
    tl.store(o_base + q_heads[:, None] * stride_oh + offs_d[None, :], out, mask=g_mask[:, None])
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
    num_warps: int = 4,
    num_stages: int = 2,
) -> Tensor:
    """Launch both passes; inputs already validated by checks.py. The keyword-only knobs are for
    tests and the benchmark sweep; None picks a default from the device and the batch."""
    batch, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    group = num_q_heads // num_kv_heads
    if not q.is_cuda and not INTERPRETED:
        raise RuntimeError(
            "paged_decode(backend='triton') on CPU needs TRITON_INTERPRET=1 set before "
            "sparrow.kernels.decode_triton is imported"
        )
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(
            f"paged_decode(triton): head dim must be a power of 2 >= 16, got {head_dim}"
        )
    if page_size & (page_size - 1):
        raise ValueError(f"paged_decode(triton): PAGE_SIZE must be a power of 2, got {page_size}")
    if pages_per_iter is None:
        pages_per_iter = 1 if INTERPRETED else 4
    pages_per_iter = max(pages_per_iter, triton.cdiv(16, page_size))  # tl.dot needs N >= 16
    # An upper bound on any row's page count that needs no device sync.
    max_slots = page_table.shape[1] if selected is None else selected.logical_pages.shape[2]
    if num_splits is None:
        num_splits = _default_num_splits(q, batch * num_kv_heads)
    num_splits = max(1, min(num_splits, triton.cdiv(max_slots, pages_per_iter)))

    o_part = torch.empty(batch, num_q_heads, num_splits, head_dim, device=q.device)
    lse_part = torch.empty(batch, num_q_heads, num_splits, device=q.device)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (B, H_q, D), contiguous
    # In dense mode the selection pointers are never read; pass page_table as a placeholder.
    sel = page_table[:, None, :] if selected is None else selected.logical_pages
    num_sel = seq_lens if selected is None else selected.num_selected
    fp32 = q.dtype == torch.float32
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, page_table, seq_lens, sel, num_sel, o_part, lse_part,
        scale * math.log2(math.e),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        page_table.stride(0), page_table.stride(1),
        sel.stride(0), sel.stride(1), sel.stride(2),
        o_part.stride(0), o_part.stride(1), o_part.stride(2),
        lse_part.stride(0), lse_part.stride(1),
        num_splits,
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, PAGES_PER_ITER=pages_per_iter, DENSE=selected is None,
        COMPUTE_FP32=INTERPRETED or fp32, DOT_PRECISION="ieee" if fp32 or INTERPRETED else "tf32",
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    _merge_splits_kernel[(batch, num_q_heads)](
        o_part, lse_part, out, num_splits,
        o_part.stride(0), o_part.stride(1), o_part.stride(2),
        lse_part.stride(0), lse_part.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, SPLITS_PAD=max(2, triton.next_power_of_2(num_splits)),
    )  # fmt: skip
    return out


def _default_num_splits(q: Tensor, num_rows: int) -> int:
    """Enough (sequence, KV head, split) programs for ~2 waves on the GPU; 1 in the interpreter,
    where programs run one after another anyway."""
    if not q.is_cuda:
        return 1
    num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    return triton.cdiv(2 * num_sms, num_rows)
