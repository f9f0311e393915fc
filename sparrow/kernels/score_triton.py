"""Triton page scoring: gathers each page's summary through the page table and scores it in one
pass, so selection reads every summary once (the torch path materialises the gathered rows).

One program per (sequence, KV head, block of BLOCK_P logical pages). Scores match
selection.page_scores_torch: "centroid" = mean group query . key centroid; "quest" = per query
head sum_d max(q_d*min_d, q_d*max_d), maxed over the GQA group. Summaries may be fp32 or q's
dtype (the engine keeps them in the cache dtype: half the bytes of fp32 for bf16); only the tables
the mode reads are passed.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from .launch_checks import check_page_scores
from .paged_cache import PageSummary


@triton.jit
def _page_score_kernel(
    q_ptr, mean_ptr, min_ptr, max_ptr, page_table_ptr, seq_lens_ptr, out_ptr,
    stride_qb, stride_qh,
    stride_sp, stride_sh,
    stride_ptb, stride_ptp,
    stride_ob, stride_oh,
    max_pages,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_P: tl.constexpr, QUEST: tl.constexpr,
    COMPUTE_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    offs_p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)  # (BLOCK_P,) logical pages
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    num_logical = tl.cdiv(tl.load(seq_lens_ptr + b), PAGE_SIZE)
    p_ok = offs_p < num_logical
    phys = tl.load(page_table_ptr + b * stride_ptb + offs_p * stride_ptp, mask=p_ok, other=0)
    phys = tl.where(p_ok, phys, 0).to(tl.int64)  # unused columns read page 0, never garbage ids
    g_mask = offs_g < GROUP
    q = tl.load(
        q_ptr + b * stride_qb + (kv_head * GROUP + offs_g)[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None],
        other=0.0,
    )  # (GROUP_PAD, HEAD_DIM)
    rows = phys[:, None] * stride_sp + kv_head * stride_sh + offs_d[None, :]  # (BLOCK_P, HEAD_DIM)
    if QUEST:
        k_min = tl.load(min_ptr + rows, mask=p_ok[:, None], other=0.0)
        k_max = tl.load(max_ptr + rows, mask=p_ok[:, None], other=0.0)
        if COMPUTE_FP32:
            q, k_min, k_max = q.to(tl.float32), k_min.to(tl.float32), k_max.to(tl.float32)
        # In bf16/fp16 the products q_d * k_d are exact in the fp32 accumulator, so the bound
        # equals the fp32 one up to summation order. Triton 3.6 (the GPU image's) returns bf16
        # max/min in fp32 and tl.dot takes one dtype: cast back (exact). Each operand is formed
        # right before its dot: both formed first took the fp32 variant to 255 registers.
        zero = tl.zeros_like(q)
        bound = tl.dot(
            tl.maximum(q, zero).to(k_max.dtype), tl.trans(k_max), input_precision=DOT_PRECISION
        )
        bound += tl.dot(
            tl.minimum(q, zero).to(k_min.dtype), tl.trans(k_min), input_precision=DOT_PRECISION
        )
        bound = tl.where(g_mask[:, None], bound, float("-inf"))  # (GROUP_PAD, BLOCK_P)
        score = tl.max(bound, axis=0)
    else:
        k_mean = tl.load(mean_ptr + rows, mask=p_ok[:, None], other=0.0).to(tl.float32)
        q_mean = tl.sum(q.to(tl.float32), axis=0) / GROUP  # (HEAD_DIM,)
        score = tl.sum(k_mean * q_mean[None, :], axis=1)  # (BLOCK_P,)
    tl.store(out_ptr + b * stride_ob + kv_head * stride_oh + offs_p, score, mask=offs_p < max_pages)


# TRITON_INTERPRET was read when the kernel above was decorated; this is what the launcher and
# the tests need to know (and it does not depend on the Triton version's config API).
INTERPRETED = type(_page_score_kernel).__name__ == "InterpretedFunction"


def page_scores_triton(
    q: Tensor,
    summary: PageSummary,
    page_table: Tensor,
    seq_lens: Tensor,
    score: str,
    page_size: int,
) -> Tensor:
    """(B, H_kv, max_pages) fp32 page scores; inputs already validated by checks.py."""
    tables = check_page_scores(q, summary, score)
    if not q.is_cuda and not INTERPRETED:
        raise RuntimeError(
            "select_pages(backend='triton') on CPU needs TRITON_INTERPRET=1 set before "
            "sparrow.kernels.score_triton is imported"
        )
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = summary.num_kv_heads
    quest = score == "quest"
    if quest and not INTERPRETED and tables[0].dtype != q.dtype:
        q = q.to(tables[0].dtype)  # tl.dot takes one dtype; the summaries' is the exact one
    group = num_q_heads // num_kv_heads
    max_pages = page_table.shape[1]
    scores = torch.empty(batch, num_kv_heads, max_pages, device=q.device)
    stride_sp, stride_sh, _ = tables[0].stride()
    k_min, k_max = (tables[0], tables[1]) if quest else (tables[0], tables[0])
    constexprs = score_constexprs(group, head_dim, page_size, tables[0].dtype, quest, INTERPRETED)
    _page_score_kernel[(batch, num_kv_heads, triton.cdiv(max_pages, constexprs["BLOCK_P"]))](
        q, tables[0], k_min, k_max, page_table, seq_lens, scores,
        q.stride(0), q.stride(1),
        stride_sp, stride_sh,
        page_table.stride(0), page_table.stride(1),
        scores.stride(0), scores.stride(1),
        max_pages,
        **constexprs,
    )  # fmt: skip
    return scores


def score_constexprs(
    group: int, head_dim: int, page_size: int, dtype: torch.dtype, quest: bool, interpreted: bool
) -> dict:
    """The scoring kernel's constexprs: one function for the launcher and the AOT variant list."""
    return {
        "GROUP": group, "GROUP_PAD": max(16, triton.next_power_of_2(group)), "HEAD_DIM": head_dim,
        # Two (BLOCK_P, D) summary tiles per program stay in registers.
        "PAGE_SIZE": page_size, "BLOCK_P": 32, "QUEST": quest,
        "COMPUTE_FP32": interpreted or dtype == torch.float32,
        # fp32 summaries: exact products (no tf32); bf16/fp16 products are exact anyway.
        "DOT_PRECISION": "ieee" if interpreted or dtype == torch.float32 else "tf32",
    }  # fmt: skip


def aot_signature(kernel: str, dtype: str, constexprs: dict) -> dict[str, str]:
    """Argument types of the scoring kernel for ahead-of-time compilation (kernels/aot.py);
    `dtype` is the page summaries' (and q's)."""
    types = {name: "i32" for name in _page_score_kernel.arg_names if name.startswith("stride")}
    types |= {name: f"*{dtype}" for name in ("q_ptr", "mean_ptr", "min_ptr", "max_ptr")}
    types |= {"page_table_ptr": "*i32", "seq_lens_ptr": "*i32", "out_ptr": "*fp32"}
    return types | {"max_pages": "i32"}
