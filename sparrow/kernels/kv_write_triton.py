"""Decode's KV append in one launch: each new token's K and V rows into its paged-cache slot,
and the summary row (centroid or min/max) of the page it lands in.

The torch path (`paged_cache.write_kv`, two `index_copy_` launches, then the engine's
`update_page_summaries` over every sparse layer after the forward: ~15 launches per step) is the
reference; here one program per token copies both rows, reading k and v as the strided views of
the fused q/k/v projection the model hands over, and recomputes its page's summary from the
page's keys so far, as `update_page_summaries` does (min/max exactly; the centroid up to the
order of an fp32 sum). A step never scores the page its token lands in (the recent window is
always kept), so writing the summary during the layer is as exact as after the forward. Under
TRITON_INTERPRET=1 (set before import) the kernel runs on CPU.
"""

import triton
import triton.language as tl
from torch import Tensor

from .launch_checks import check_write_kv
from .paged_cache import PageSummary


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, mean_ptr, min_ptr, max_ptr,
    stride_kn, stride_kh, stride_vn, stride_vh,
    NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr, MEAN: tl.constexpr, MIN_MAX: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0)
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = (offs_h < NUM_KV_HEADS)[:, None]
    slot = tl.load(slot_ptr + n).to(tl.int64)  # int64: large caches overflow int32 offsets
    # The cache is contiguous (num_pages * PAGE_SIZE, H_kv, D): a slot is one (H_kv, D) block.
    row = NUM_KV_HEADS * HEAD_DIM
    dst = slot * row + offs_h[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k_ptr + n * stride_kn + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + n * stride_vn + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)
    if MEAN or MIN_MAX:
        # The token's page summary, from the page's first `fill` keys: the earlier ones from the
        # cache (written by earlier steps), this one from the input (not read back: a program's
        # own store need not be visible to its other threads).
        page = slot // PAGE_SIZE
        fill = slot % PAGE_SIZE + 1
        offs_t = tl.arange(0, PAGE_SIZE)
        earlier = (offs_t < fill - 1)[:, None]  # (PAGE_SIZE, 1)
        for h in tl.static_range(NUM_KV_HEADS):
            rows = (page * PAGE_SIZE + offs_t)[:, None] * row + h * HEAD_DIM + offs_d[None, :]
            keys = tl.load(k_cache_ptr + rows, mask=earlier, other=0.0).to(tl.float32)
            k_new = tl.load(k_ptr + n * stride_kn + h * stride_kh + offs_d)
            k_new = k_new.to(k_cache_ptr.dtype.element_ty).to(tl.float32)  # as cached
            out = page * row + h * HEAD_DIM + offs_d  # (HEAD_DIM,) row of the summary tables
            if MEAN:
                total = tl.sum(keys, axis=0) + k_new  # masked keys are 0
                tl.store(mean_ptr + out, (total / fill).to(mean_ptr.dtype.element_ty))
            if MIN_MAX:
                k_min = tl.minimum(tl.min(tl.where(earlier, keys, float("inf")), axis=0), k_new)
                k_max = tl.maximum(tl.max(tl.where(earlier, keys, float("-inf")), axis=0), k_new)
                tl.store(min_ptr + out, k_min.to(min_ptr.dtype.element_ty))
                tl.store(max_ptr + out, k_max.to(max_ptr.dtype.element_ty))


# TRITON_INTERPRET was read when the kernel above was decorated.
INTERPRETED = type(_write_kv_kernel).__name__ == "InterpretedFunction"


def write_kv(
    k_cache: Tensor,
    v_cache: Tensor,
    k: Tensor,
    v: Tensor,
    slot_mapping: Tensor,
    summary: PageSummary | None = None,
) -> None:
    """As paged_cache.write_kv: k, v (N, H_kv, D) (unit last stride; strided rows and heads are
    fine) written in place at `slot_mapping` (N,) = page * PAGE_SIZE + offset of the contiguous
    caches (num_pages, PAGE_SIZE, H_kv, D); with `summary` (this layer's tables, contiguous),
    also the summary rows of each written page from its first offset + 1 tokens, as
    `update_page_summaries` computes them (decode: one token per sequence, so no two programs
    write one page unless they write the same keys). Slot ids are not checked (no device sync):
    the engine's plan makes them."""
    check_write_kv(k_cache, v_cache, k, v, slot_mapping, summary)
    _, page_size, num_kv_heads, head_dim = k_cache.shape
    if not k.is_cuda and not INTERPRETED:
        raise RuntimeError(
            "write_kv(triton) needs CUDA, or TRITON_INTERPRET=1 set before "
            "sparrow.kernels.kv_write_triton is imported"
        )
    if slot_mapping.numel() == 0:
        return
    mean = None if summary is None else summary.k_mean
    k_min = None if summary is None else summary.k_min
    k_max = None if summary is None else summary.k_max
    _write_kv_kernel[(slot_mapping.shape[0],)](
        k, v, k_cache, v_cache, slot_mapping,
        k_cache if mean is None else mean,  # placeholders where a table is absent: never read
        k_cache if k_min is None else k_min,
        k_cache if k_max is None else k_max,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        **write_kv_constexprs(num_kv_heads, head_dim, page_size, mean is not None,
                              k_min is not None),
    )  # fmt: skip


def write_kv_constexprs(
    num_kv_heads: int, head_dim: int, page_size: int, mean: bool, min_max: bool
) -> dict:
    """The kernel's constexprs: one function for the launcher and the AOT variant list."""
    return {
        "NUM_KV_HEADS": num_kv_heads, "HEADS_PAD": triton.next_power_of_2(num_kv_heads),
        "HEAD_DIM": head_dim, "PAGE_SIZE": page_size, "MEAN": mean, "MIN_MAX": min_max,
    }  # fmt: skip


def aot_signature(kernel: str, dtype: str, constexprs: dict) -> dict[str, str]:
    """Argument types of the kernel for ahead-of-time compilation (kernels/aot.py)."""
    types = {name: "i32" for name in _write_kv_kernel.arg_names if name.startswith("stride")}
    names = ("k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr", "mean_ptr", "min_ptr", "max_ptr")
    types |= {name: f"*{dtype}" for name in names}  # summaries in the cache dtype (the engine's)
    return types | {"slot_ptr": "*i64"}
