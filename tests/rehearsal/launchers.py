"""The real Triton launchers in the rehearsal: each `sparrow::` op runs its host launcher
(`*_triton.py`) on the fake CUDA tensors instead of its fake implementation, and each
`kernel[grid](...)` is recorded instead of launched.

Under plain `FakeTensorMode` an op's fake implementation (kernels/ops.py: the argument checks,
then empty outputs) stands in for the launcher, so whatever the launcher itself does (its split
choice, its output allocation, its grid, a host sync or a CPU tensor someone adds to it) is never
rehearsed. `LauncherRecorder`, entered innermost (inside the harness's `HotPathGuard`), calls the
launcher instead: its torch ops pass through the guard, which names the launcher's line for a
sync, a CPU tensor or an upcast; the launch itself is checked here (every tensor argument on the
device, the decode kernels' pointer dtypes against their ahead-of-time signatures, naming where
a wrong tensor was made) and recorded with its grid and the model layer it ran in; and the op's
outputs must match what its fake implementation promises (shape, dtype, device).

The launchers choose as on a GPU: each kernel module's `INTERPRETED` reads False while the
recorder is active (the test process imported them under TRITON_INTERPRET=1), and the split
kernel's compiled occupancy, which the launcher asks Triton for through `kernel.warmup`, is the
one given (`occupancy`: registers and shared memory per DENSE, e.g. from cuda_splits, compiled
for sm_90 ahead of time).
"""

import importlib
import sys
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from fake_cuda import FakeCudaMethods
from hot_path import RehearsalFault
from stack_regions import sparrow_frames, where
from torch.utils._python_dispatch import TorchDispatchMode

from sparrow.bench.dispatch_counter import wrap_triton_runs
from sparrow.kernels import ops

MODULES = ("decode_triton", "score_triton", "select_triton", "norm_rope_triton",
           "swiglu_triton", "kv_write_triton")  # fmt: skip
# The real implementation of each op (what CompositeExplicitAutograd runs on a device).
REAL = {
    "paged_decode": ops._paged_decode, "page_scores": ops._page_scores,
    "select_pages": ops._select_pages, "write_kv": ops._write_kv, "rms_norm": ops._rms_norm,
    "add_rms_norm": ops._add_rms_norm, "qk_norm_rope": ops._qk_norm_rope,
    "silu_mul": ops._silu_mul,
}  # fmt: skip
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
               torch.int32: "i32", torch.int64: "i64"}  # fmt: skip
# Kernels whose pointer dtypes are checked against their module's aot_signature.
SIGNED = {"_decode_split_kernel": "decode_split", "_merge_splits_kernel": "merge_splits"}


@dataclass
class Launch:
    kernel: str
    grid: tuple[int, ...]
    op: str  # the sparrow op whose launcher launched it
    phase: str  # "decode" (ModelRunner._forward on the stack) or "prefill"
    layer: int | None  # the model layer (DecoderModel._forward's loop), None outside
    site: str  # the launcher's line


class _Made(TorchDispatchMode):
    """Tags every tensor an op makes with the sparrow line that made it (`_made_at`)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        frames = sparrow_frames(1)
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and frames:
                t._made_at = where(frames[0])
        return out


class LauncherRecorder(TorchDispatchMode):
    def __init__(self, occupancy: dict[bool, tuple[int, int]]):
        """occupancy: DENSE -> (registers per thread, shared bytes) of the split kernel."""
        super().__init__()
        self.occupancy = occupancy
        self.launches: list[Launch] = []
        self.ops = Counter()
        self._op: tuple[str, tuple] | None = None  # the op being run, and its args

    def __enter__(self):
        modules = [importlib.import_module(f"sparrow.kernels.{m}") for m in MODULES]
        self._interpreted = [(m, m.INTERPRETED) for m in modules]
        for m in modules:
            m.INTERPRETED = False
        self._runs = wrap_triton_runs(modules, self._wrap)
        self._runs.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self._runs.__exit__(*exc)
        for m, value in self._interpreted:
            m.INTERPRETED = value

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace != "sparrow":
            return func(*args, **kwargs)
        name = func._schema.name.split("::")[-1]
        self.ops[name] += 1
        outer, self._op = self._op, (name, args)
        try:
            # Torch functions are off inside a dispatch handler; the launcher is Python code that
            # indexes and copies tensors, which on fake CUDA needs the harness's FakeCudaMethods.
            with torch._C._EnableTorchFunction(), FakeCudaMethods(), _Made():
                out = REAL[name](*args, **kwargs)
        finally:
            self._op = outer
        self._check_contract(name, func, args, kwargs, out)
        return out

    def _check_contract(self, name, func, args, kwargs, out) -> None:
        """The launcher's outputs against the fake implementation's (the op's contract)."""
        promised = func(*args, **kwargs)  # FakeTensorMode runs the fake implementation
        got = out if isinstance(out, tuple) else (out,)
        want = promised if isinstance(promised, tuple) else (promised,)
        for g, w in zip(got, want, strict=True):
            if g is None and w is None:
                continue
            if (g.shape, g.dtype, g.device) != (w.shape, w.dtype, w.device):
                made = getattr(g, "_made_at", "?")
                raise RehearsalFault(
                    f"{name}'s launcher returned {g.dtype} {tuple(g.shape)} on {g.device}, its "
                    f"op promises {w.dtype} {tuple(w.shape)} on {w.device}, made at {made}"
                )

    def _wrap(self, name, kernel, run):
        def record(*args, grid, warmup, **kwargs):
            if warmup:  # the launcher asks for the compiled variant's resources
                regs, smem = self.occupancy[bool(kwargs.get("DENSE"))]
                return SimpleNamespace(n_regs=regs, metadata=SimpleNamespace(shared=smem),
                                       _init_handles=lambda: None)  # fmt: skip
            self._record(name, kernel, grid, args, kwargs)
            return None

        return record

    def _record(self, name, kernel, grid, args, kwargs) -> None:
        frames = sparrow_frames(1)
        site = where(frames[0]) if frames else "(no sparrow frame)"
        values = dict(zip(kernel.arg_names, args, strict=False))
        for arg, t in values.items():
            if isinstance(t, torch.Tensor) and t.device.type != "cuda":
                made = getattr(t, "_made_at", "?")
                raise RehearsalFault(f"CPU tensor passed to {name} ({arg}, made at {made}) at "
                                     f"{site}")  # fmt: skip
        if name in SIGNED:
            self._check_signature(name, kernel, values, kwargs, site)
        if callable(grid):
            grid = grid(kwargs)
        grid = tuple(int(g) for g in grid)
        if min(grid) < 1:
            raise RehearsalFault(f"empty grid {grid} for {name} at {site}")
        op = self._op[0] if self._op else "?"
        self.launches.append(Launch(name, grid, op, *_phase_layer(), site))

    def _check_signature(self, name, kernel, values, constexprs, site) -> None:
        module = sys.modules[kernel.fn.__module__]
        q = self._op[1][0]  # the op's q: the activations' and the cache's dtype
        types = module.aot_signature(SIGNED[name], DTYPE_NAMES[q.dtype], constexprs)
        for arg, t in values.items():
            want = types.get(arg, "")
            if not (want.startswith("*") and isinstance(t, torch.Tensor)):
                continue
            if DTYPE_NAMES.get(t.dtype) != want[1:]:
                made = getattr(t, "_made_at", "?")
                raise RehearsalFault(
                    f"wrong dtype passed to {name}: {arg} is {t.dtype}, the kernel takes "
                    f"{want[1:]} (made at {made}) at {site}"
                )


def _phase_layer() -> tuple[str, int | None]:
    """("decode" | "prefill", the layer index of DecoderModel._forward's loop or None)."""
    phase, layer, f = "prefill", None, sys._getframe(2)
    while f is not None:
        code = f.f_code
        if code.co_name == "_forward" and code.co_filename.endswith("sparrow/rollout/model.py"):
            layer = f.f_locals.get("i")
        if code.co_name == "_forward" and code.co_filename.endswith("rollout/model_runner.py"):
            phase = "decode"
        f = f.f_back
    return phase, layer
