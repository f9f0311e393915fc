"""Fused SwiGLU activation: silu(gate) * up of the fused gate/up projection, one launch.

The MLP's `F.silu(gate) * up` is two launches (and a (N, I) temporary) per layer; decode at small
batch is bound by launches. The kernel reproduces the torch path's rounding: silu in fp32 rounded
to the model dtype, then the product in fp32 rounded again (what two bf16/fp16 torch ops do); in
fp32 both roundings are no-ops. `silu_mul_reference` is that torch path. Under TRITON_INTERPRET=1
(set before import) the kernel runs on CPU.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from .launch_checks import check_silu_mul


@triton.jit
def _silu_mul_kernel(
    gate_up_ptr, out_ptr, inter,
    stride_gn, stride_on,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # (BLOCK,) columns of the output
    mask = offs < inter
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(gate_up_ptr + row * stride_gn + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_gn + inter + offs, mask=mask, other=0.0)
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)  # rounded as F.silu's output
    tl.store(out_ptr + row * stride_on + offs, (act * up.to(tl.float32)).to(dtype), mask=mask)


# TRITON_INTERPRET was read when the kernel above was decorated.
INTERPRETED = type(_silu_mul_kernel).__name__ == "InterpretedFunction"


def silu_mul(gate_up: Tensor) -> Tensor:
    """gate_up (N, 2 I), gate then up along the last dim -> silu(gate) * up (N, I), contiguous."""
    check_silu_mul(gate_up)
    if not gate_up.is_cuda and not INTERPRETED:
        raise RuntimeError(
            "silu_mul needs CUDA, or TRITON_INTERPRET=1 set before "
            "sparrow.kernels.swiglu_triton is imported"
        )
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype, device=gate_up.device)  # (N, I)
    constexprs = silu_mul_constexprs()
    _silu_mul_kernel[(rows, triton.cdiv(inter, constexprs["BLOCK"]))](
        gate_up, out, inter, gate_up.stride(0), out.stride(0), **constexprs
    )
    return out


def silu_mul_constexprs() -> dict:
    """The kernel's constexprs: one function for the launcher and the AOT variant list."""
    return {"BLOCK": 1024}


def aot_signature(kernel: str, dtype: str, constexprs: dict) -> dict[str, str]:
    """Argument types of the kernel for ahead-of-time compilation (kernels/aot.py)."""
    return {"gate_up_ptr": f"*{dtype}", "out_ptr": f"*{dtype}", "inter": "i32",
            "stride_gn": "i32", "stride_on": "i32"}  # fmt: skip


def silu_mul_reference(gate_up: Tensor) -> Tensor:
    """The torch ops the kernel replaces."""
    gate, up = gate_up.chunk(2, dim=-1)  # (N, I) each
    return torch.nn.functional.silu(gate) * up
