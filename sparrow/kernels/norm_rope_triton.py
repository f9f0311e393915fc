"""Fused RMSNorm (+ residual add) and per-head RMSNorm + RoPE of q and k, for bf16/fp16 decode.

Each replaces a chain of small torch ops (six for an RMSNorm, seven for RoPE, plus the residual
add) with one launch; decode at small batch is bound by launches, not bytes. Both reproduce the
transformers rounding the torch path uses, step by step: normalise in fp32, round to the model
dtype, then multiply by the weight (rounded again); RoPE rounds x*cos and x_rot*sin before their
sum, as two bf16 products and a bf16 add do. `add_rms_norm_reference` and
`qk_norm_rope_reference` are that torch path. Under TRITON_INTERPRET=1 (set before import) the
kernels run on CPU; the roundings are casts of fp32 values, which the interpreter gets right.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from .launch_checks import check_add_rms_norm, check_qk_norm_rope


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr,
    n_cols, eps,
    stride_x, stride_r, stride_o, stride_s,
    BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)  # (BLOCK,)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)  # one rounding
        tl.store(sum_ptr + row * stride_s + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    y = (xf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)  # rounded before the weight
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (y * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr,
    num_heads, eps,
    stride_xn, stride_xh, stride_cn, stride_sn, stride_on, stride_oh,
    HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr, HAS_NORM: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0)
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    swap_d = (offs_d + HEAD_DIM // 2) % HEAD_DIM  # rotate_half's partner lane
    h_mask = (offs_h < num_heads)[:, None]
    rows = x_ptr + n * stride_xn + offs_h[:, None] * stride_xh
    x = tl.load(rows + offs_d[None, :], mask=h_mask, other=0.0)  # (HEADS_PAD, HEAD_DIM)
    x_sw = tl.load(rows + swap_d[None, :], mask=h_mask, other=0.0)
    dtype = x_ptr.dtype.element_ty
    xf = x.to(tl.float32)
    x_swf = x_sw.to(tl.float32)
    if HAS_NORM:
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / HEAD_DIM + eps)  # (HEADS_PAD,)
        w_rows = w_ptr + offs_h[:, None] * HEAD_DIM
        w = tl.load(w_rows + offs_d[None, :], mask=h_mask, other=0.0).to(tl.float32)
        w_sw = tl.load(w_rows + swap_d[None, :], mask=h_mask, other=0.0).to(tl.float32)
        xf = (xf * rstd[:, None]).to(dtype).to(tl.float32) * w
        x_swf = (x_swf * rstd[:, None]).to(dtype).to(tl.float32) * w_sw
        xf = xf.to(dtype).to(tl.float32)
        x_swf = x_swf.to(dtype).to(tl.float32)
    cos = tl.load(cos_ptr + n * stride_cn + offs_d).to(tl.float32)  # (HEAD_DIM,)
    sin = tl.load(sin_ptr + n * stride_sn + offs_d).to(tl.float32)  # sign of rotate_half folded
    a = (xf * cos[None, :]).to(dtype).to(tl.float32)
    b = (x_swf * sin[None, :]).to(dtype).to(tl.float32)
    out = out_ptr + n * stride_on + offs_h[:, None] * stride_oh + offs_d[None, :]
    tl.store(out, (a + b).to(dtype), mask=h_mask)


# TRITON_INTERPRET was read when the kernels above were decorated.
INTERPRETED = type(_add_rms_norm_kernel).__name__ == "InterpretedFunction"


def add_rms_norm(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """x, residual (N, C) -> (x + residual, rms_norm(x + residual) * weight), both (N, C) in x's
    dtype; without a residual the first is x itself. weight (C,)."""
    check_add_rms_norm(x, weight, residual)
    n_rows, n_cols = x.shape
    _check_launchable(x)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    total = x if residual is None else torch.empty_like(out)
    _add_rms_norm_kernel[(n_rows,)](
        x, x if residual is None else residual, weight, out, total,
        n_cols, eps,
        x.stride(0), 0 if residual is None else residual.stride(0), out.stride(0),
        total.stride(0),
        **add_rms_norm_constexprs(n_cols, residual is not None),
    )  # fmt: skip
    return total, out


def qk_norm_rope(qk: Tensor, weight: Tensor | None, cos: Tensor, sin: Tensor, eps: float) -> Tensor:
    """qk (N, H, D) (a strided view is fine), per-head weight (H, D) or None (no norm), cos, sin
    (N, 1, D) as `Rope.cos_sin` gives them -> rotated (and normalised) (N, H, D), contiguous."""
    check_qk_norm_rope(qk, weight, cos, sin)
    n, heads, head_dim = qk.shape
    _check_launchable(qk)
    out = torch.empty(qk.shape, dtype=qk.dtype, device=qk.device)
    _qk_norm_rope_kernel[(n,)](
        qk, qk if weight is None else weight, cos, sin, out,
        heads, eps,
        qk.stride(0), qk.stride(1), cos.stride(0), sin.stride(0), out.stride(0), out.stride(1),
        **qk_norm_rope_constexprs(heads, head_dim, weight is not None),
    )  # fmt: skip
    return out


def add_rms_norm_constexprs(n_cols: int, has_residual: bool) -> dict:
    return {"BLOCK": triton.next_power_of_2(n_cols), "HAS_RESIDUAL": has_residual}


def qk_norm_rope_constexprs(num_heads: int, head_dim: int, has_norm: bool) -> dict:
    return {"HEAD_DIM": head_dim, "HEADS_PAD": triton.next_power_of_2(num_heads),
            "HAS_NORM": has_norm}  # fmt: skip


def aot_signature(kernel: str, dtype: str, constexprs: dict) -> dict[str, str]:
    """Argument types of `kernel` for ahead-of-time compilation (kernels/aot.py)."""
    fn = _add_rms_norm_kernel if kernel == "add_rms_norm" else _qk_norm_rope_kernel
    types = {name: "i32" for name in fn.arg_names if name.startswith("stride")}
    types |= {name: f"*{dtype}" for name in fn.arg_names if name.endswith("_ptr")}
    return types | {"eps": "fp32", "n_cols": "i32", "num_heads": "i32"}


def add_rms_norm_reference(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The torch ops the kernel replaces (transformers' RMSNorm rounding)."""
    total = x if residual is None else x + residual
    xf = total.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return total, weight * xf.to(x.dtype)


def qk_norm_rope_reference(
    qk: Tensor, weight: Tensor | None, cos: Tensor, sin: Tensor, eps: float
) -> Tensor:
    """The torch ops the kernel replaces: per-head RMSNorm, then rotate_half RoPE."""
    if weight is not None:
        qk = add_rms_norm_reference(qk, weight, eps)[1]
    half = qk.shape[-1] // 2
    swapped = torch.cat((qk[..., half:], qk[..., :half]), dim=-1)  # (N, H, D): (x2, x1)
    return qk * cos + swapped * sin


def _check_launchable(t: Tensor) -> None:
    if not t.is_cuda and not INTERPRETED:
        raise RuntimeError(
            "the fused norm/RoPE kernels need CUDA, or TRITON_INTERPRET=1 set before "
            "sparrow.kernels.norm_rope_triton is imported"
        )
