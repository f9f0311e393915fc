"""Decode's KV append in one launch: each new token's K and V rows into its paged-cache slot.

`paged_cache.write_kv` (the reference, and the CPU path) is two `index_copy_` launches, plus a
cast each when the inputs are not in the cache dtype; here one program per token copies both,
reading k and v as the strided views of the fused q/k/v projection the model hands over. The
page summaries are not written here: the engine refreshes them once per step for all sparse
layers after the forward (a step never scores the page its token lands in). Under
TRITON_INTERPRET=1 (set before import) the kernel runs on CPU.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kn, stride_kh, stride_vn, stride_vh,
    NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0)
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = (offs_h < NUM_KV_HEADS)[:, None]
    slot = tl.load(slot_ptr + n).to(tl.int64)  # int64: large caches overflow int32 offsets
    # The cache is contiguous (num_pages * PAGE_SIZE, H_kv, D): a slot is one (H_kv, D) block.
    dst = slot * (NUM_KV_HEADS * HEAD_DIM) + offs_h[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k_ptr + n * stride_kn + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + n * stride_vn + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


# TRITON_INTERPRET was read when the kernel above was decorated.
INTERPRETED = type(_write_kv_kernel).__name__ == "InterpretedFunction"


def write_kv(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slot_mapping: Tensor) -> None:
    """As paged_cache.write_kv: k, v (N, H_kv, D) (unit last stride; strided rows and heads are
    fine) written in place at `slot_mapping` (N,) = page * PAGE_SIZE + offset of the contiguous
    caches (num_pages, PAGE_SIZE, H_kv, D). Slot ids are not checked (no device sync): the
    engine's plan makes them."""
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
    if head_dim & (head_dim - 1):
        raise ValueError(f"write_kv(triton): head dim must be a power of 2, got {head_dim}")
    if not k.is_cuda and not INTERPRETED:
        raise RuntimeError(
            "write_kv(triton) needs CUDA, or TRITON_INTERPRET=1 set before "
            "sparrow.kernels.kv_write_triton is imported"
        )
    if slot_mapping.numel() == 0:
        return
    _write_kv_kernel[(slot_mapping.shape[0],)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        **write_kv_constexprs(num_kv_heads, head_dim),
    )  # fmt: skip


def write_kv_constexprs(num_kv_heads: int, head_dim: int) -> dict:
    """The kernel's constexprs: one function for the launcher and the AOT variant list."""
    return {"NUM_KV_HEADS": num_kv_heads, "HEADS_PAD": triton.next_power_of_2(num_kv_heads),
            "HEAD_DIM": head_dim}  # fmt: skip


def aot_signature(kernel: str, dtype: str, constexprs: dict) -> dict[str, str]:
    """Argument types of the kernel for ahead-of-time compilation (kernels/aot.py)."""
    types = {name: "i32" for name in _write_kv_kernel.arg_names if name.startswith("stride")}
    types |= {name: f"*{dtype}" for name in ("k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr")}
    return types | {"slot_ptr": "*i64"}
