"""Ahead-of-time compilation of sparrow's Triton kernels for a GPU that is not there.

`compile_variant` compiles one `KernelVariant` (a kernel, its dtype, constexprs and launch
options) for Hopper (sm_90) with Triton's own toolchain (the wheel ships ptxas and cuobjdump),
and reads the cubin's resource usage: registers per thread, stack and local memory (ptxas'
spills: Triton kernels use neither otherwise) and the shared memory Triton launches with. It
needs only Triton's CUDA backend, no driver. Each kernel module says how its arguments are
typed (`aot_signature`); which variants exist is for the caller to enumerate
(sparrow.bench.kernel_aot). Must run in a process where TRITON_INTERPRET is unset when the
kernel modules are imported.
"""

import importlib
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import triton

# kernel name -> (module, jit function): every Triton kernel in this package.
KERNELS = {
    "decode_split": ("decode_triton", "_decode_split_kernel"),
    "merge_splits": ("decode_triton", "_merge_splits_kernel"),
    "page_score": ("score_triton", "_page_score_kernel"),
    "add_rms_norm": ("norm_rope_triton", "_add_rms_norm_kernel"),
    "qk_norm_rope": ("norm_rope_triton", "_qk_norm_rope_kernel"),
    "select_pages": ("select_triton", "_select_pages_kernel"),
    "silu_mul": ("swiglu_triton", "_silu_mul_kernel"),
    "write_kv": ("kv_write_triton", "_write_kv_kernel"),
}
_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+).*?LOCAL:(\d+)")


@dataclass(frozen=True)
class KernelVariant:
    """One compiled form of a kernel: what Triton specialises on besides pointer alignment."""

    kernel: str  # a KERNELS key
    dtype: str  # "bf16" | "fp16" | "fp32": the activations / KV cache
    constexprs: tuple[tuple[str, object], ...]  # (name, value) pairs, sorted by name
    num_warps: int
    num_stages: int

    def row(self) -> dict:
        return {"kernel": self.kernel, "dtype": self.dtype, **dict(self.constexprs),
                "num_warps": self.num_warps, "num_stages": self.num_stages}  # fmt: skip


def backend_available() -> bool:
    """Whether this Triton build can compile for NVIDIA GPUs (its CUDA backend is installed)."""
    try:
        from triton.backends import backends
    except ImportError:
        return False
    return "nvidia" in backends


def compile_variant(variant: KernelVariant, arch: int = 90) -> dict:
    """Compile for sm_`arch`; returns variant.row() plus regs, spills (bytes), smem_bytes."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module_name, fn_name = KERNELS[variant.kernel]
    module = importlib.import_module(f"{__package__}.{module_name}")
    fn = getattr(module, fn_name)
    if module.INTERPRETED:
        raise RuntimeError("AOT compilation needs TRITON_INTERPRET unset when kernels import")
    constexprs = dict(variant.constexprs)
    types = module.aot_signature(variant.kernel, variant.dtype, constexprs)
    signature = {name: types.get(name, "constexpr") for name in fn.arg_names}
    missing = [n for n in fn.arg_names if signature[n] == "constexpr" and n not in constexprs]
    if missing:
        raise ValueError(f"{variant.kernel}: no type or constexpr value for {missing}")
    # Tensors from torch's allocator are 16-byte aligned, which the JIT specialises on too.
    attrs = {
        (fn.arg_names.index(n),): [["tt.divisibility", 16]]
        for n, t in signature.items()
        if t.startswith("*")
    }
    compiled = triton.compile(
        ASTSource(fn, signature, constexprs, attrs),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": variant.num_warps, "num_stages": variant.num_stages},
    )
    regs, spill_bytes = _resource_usage(compiled.asm["cubin"])
    return {**variant.row(), "regs": regs, "spills": spill_bytes,
            "smem_bytes": compiled.metadata.shared}  # fmt: skip


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, spilled bytes) of the cubin's one kernel, via cuobjdump. Triton
    inlines every call and uses no local arrays, so any stack frame or local memory is spills."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run(
            [tool, "-res-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    found = _RESOURCES.search(text)
    if found is None:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{text}")
    return int(found.group(1)), int(found.group(2)) + int(found.group(3))
