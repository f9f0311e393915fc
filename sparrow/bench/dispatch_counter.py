"""Counting what a piece of torch code launches and where it waits for the device, without a GPU.

`DispatchCounter` is a TorchDispatchMode: every aten op that reaches a backend passes through it.
It counts

- launches: ops that run a kernel on a GPU. Views and metadata-only ops (view, reshape aliases,
  slicing, expand, permute, transpose, as_strided, t, unsqueeze, squeeze, detach, alias,
  _unsafe_view, split/chunk/unbind, select) are excluded: they describe a tensor, move no data.
  Factory ops that fill memory (zeros, full, arange, ...) count, `empty` does not (no kernel);
  nor does an op that returns (a view of) its input (a `.to()` or `.contiguous()` with nothing
  to do). In-place ops and `out=` variants count.
- host syncs: `aten._local_scalar_dense` and the Tensor methods that read a value back
  (`tolist`, `item`, `int()`, `float()`, `bool()`, `__index__`: on a CPU tensor these may bypass
  the dispatcher, so the counter wraps them while active), copies from a CUDA
  tensor to the CPU, and the ops whose output shape depends on the data (nonzero, unique
  variants, masked_select, boolean-mask indexing, repeat_interleave without output size): each
  one reads a device value back.

With `strict=True` a host sync raises `HostSyncError` at the op that caused it (the sync guard of
the decode tests). Triton launches do not go through the dispatcher: `count_triton_launches`
wraps the `run` of each JIT kernel of the given modules (`wrap_triton_runs`: on the kernel object,
never a stand-in for it in its module, so that a kernel compiled meanwhile still finds its
@triton.jit helpers) and counts each `kernel[grid](...)` call; the `sparrow::` ops that wrap them
(kernels/ops.py) pass through uncounted.
"""

import contextlib
import types
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# Ops that only describe a tensor (no kernel, no data movement).
NO_LAUNCH = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "permute", "transpose", "t",
    "unsqueeze", "squeeze", "slice", "select", "as_strided", "detach", "alias", "split",
    "split_with_sizes", "chunk", "unbind", "empty", "empty_strided", "empty_like", "lift_fresh",
    "view_as", "narrow", "unfold", "diagonal", "movedim", "sym_size", "sym_stride", "is_same_size",
    "sym_numel", "sym_storage_offset", "resolve_conj", "resolve_neg", "item",
}  # fmt: skip
# Ops whose output shape depends on tensor values: the host must read them back.
DATA_DEPENDENT = {
    "nonzero", "nonzero_static_noop", "unique", "_unique", "_unique2", "unique_dim",
    "unique_consecutive", "masked_select", "repeat_interleave", "nonzero_numpy",
}  # fmt: skip


class HostSyncError(RuntimeError):
    """A host sync inside code that must not have one."""


def _op_name(func) -> str:
    return func._schema.name.split("::")[-1]


def _bool_index(func, args) -> bool:
    """aten.index(_put) with a boolean mask: the selected count is data-dependent."""
    if _op_name(func) not in ("index", "index_put", "index_put_", "_index_put_impl_"):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
    )


def _returns_alias(name: str, args, out) -> bool:
    """An out-of-place op that hands back (a view of) an input: no kernel ran (a `.to()` or
    `.contiguous()` that had nothing to do, a reshape that is a view)."""
    if name.endswith("_") or not isinstance(out, torch.Tensor):
        return False
    storage = out.untyped_storage().data_ptr()
    return any(
        isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == storage for a in args
    )


def _device_to_host(name: str, args, kwargs) -> bool:
    """A copy from a CUDA tensor to the CPU (`.cpu()`, `.to("cpu")`, `cpu_tensor.copy_(cuda)`)."""
    if name == "_to_copy":
        device = (kwargs or {}).get("device")
        return args[0].is_cuda and device is not None and torch.device(device).type == "cpu"
    if name == "copy_":
        return not args[0].is_cuda and args[1].is_cuda
    return False


class DispatchCounter(TorchDispatchMode):
    def __init__(self, strict: bool = False):
        super().__init__()
        self.strict = strict
        self.launches: Counter[str] = Counter()  # op name -> count, for ops that launch a kernel
        self.syncs: Counter[str] = Counter()  # op name -> count, for host syncs
        self.group: str | None = None  # label the next ops are counted under (e.g. a layer)
        self.by_group: Counter[str | None] = Counter()  # group -> launches
        self.syncs_by_group: Counter[str | None] = Counter()  # group -> host syncs
        self.ops_by_group: dict[str | None, Counter] = {}  # group -> op name -> launches
        # kernel name -> launches (count_triton_launches)
        self.triton_launches: Counter[str] = Counter()
        self.paused = False  # set during a Triton launch: what it does inside is not counted
        self._inside = 0

    @property
    def num_launches(self) -> int:
        return sum(self.launches.values())

    @property
    def num_syncs(self) -> int:
        return sum(self.syncs.values())

    # Tensor methods that read a value back but may bypass the dispatcher on CPU tensors.
    _READBACKS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__")

    def __enter__(self):
        self._saved = {name: getattr(torch.Tensor, name) for name in self._READBACKS}
        self._inside = 0  # > 0 while a wrapped read-back runs (its own dispatch is not counted)

        for name, method in self._saved.items():

            def wrapped(t, *args, _name=name, _method=method, **kwargs):
                if not self._inside:
                    self._sync(_name)
                self._inside += 1
                try:
                    return _method(t, *args, **kwargs)
                finally:
                    self._inside -= 1

            setattr(torch.Tensor, name, wrapped)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, method in self._saved.items():
            setattr(torch.Tensor, name, method)
        return super().__exit__(*exc)

    def _sync(self, name: str) -> None:
        if self.strict:
            raise HostSyncError(f"host sync in guarded code: {name}")
        self.syncs[name] += 1
        self.syncs_by_group[self.group] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "sparrow":  # a Triton launch as a torch op (kernels/ops.py): its
            return func(*args, **(kwargs or {}))  # kernels are counted by count_triton_launches
        name = _op_name(func)
        sync = (
            name == "_local_scalar_dense"
            or name in DATA_DEPENDENT
            or _bool_index(func, args)
            or _device_to_host(name, args, kwargs)
        )
        if self.paused:  # inside a counted Triton launch: the interpreter's own copies
            return func(*args, **(kwargs or {}))
        if sync and not self._inside:
            self._sync(f"aten.{name}")
        out = func(*args, **(kwargs or {}))
        if not sync and name not in NO_LAUNCH and not _returns_alias(name, args, out):
            self.record(name)
        return out

    def record(self, name: str) -> None:
        """One kernel launch of `name` under the current group."""
        self.launches[name] += 1
        self.by_group[self.group] += 1
        self.ops_by_group.setdefault(self.group, Counter())[name] += 1


# What a Triton kernel object is: compiled, interpreted (TRITON_INTERPRET=1), or autotuned.
KERNEL_TYPES = ("JITFunction", "InterpretedFunction", "Autotuner")


@contextlib.contextmanager
def wrap_triton_runs(modules: list[types.ModuleType], wrap):
    """While open, each Triton kernel defined at the top level of `modules` launches through
    `wrap(name, kernel, run)`, a function that takes `run`'s arguments (`*args, grid=, warmup=,
    **kwargs`) and may call `run`. `kernel[grid](...)` calls `kernel.run`: the wrapper is set
    on the kernel object itself, which stays in its module. A kernel compiled while the context
    is open (its first launch at a new specialisation) resolves its @triton.jit helpers from the
    module's globals, and a stand-in object there would not compile. Nests; restored on exit."""
    patched = []
    for module in modules:
        for name, kernel in vars(module).items():
            if type(kernel).__name__ in KERNEL_TYPES:
                own = vars(kernel).get("run", _ABSENT)  # an enclosing wrap's, if any
                kernel.run = wrap(name, kernel, kernel.run)
                patched.append((kernel, own))
    try:
        yield
    finally:
        for kernel, own in reversed(patched):
            if own is _ABSENT:
                del kernel.run
            else:
                kernel.run = own


_ABSENT = object()


@contextlib.contextmanager
def count_triton_launches(modules: list[types.ModuleType], counter: DispatchCounter):
    """Count `kernel[grid](...)` launches of every Triton JIT kernel defined at the top level of
    `modules` into `counter` (as launches named `triton:<kernel>`) while the context is open."""

    def wrap(name, kernel, run):
        def counted(*args, grid, warmup, **kwargs):
            if warmup:  # compiles, launches nothing
                return run(*args, grid=grid, warmup=warmup, **kwargs)
            counter.record(f"triton:{name}")
            counter.triton_launches[name] += 1
            # Under TRITON_INTERPRET the launch copies its tensor arguments with torch ops; on
            # a GPU it is one launch.
            paused, counter.paused = counter.paused, True
            try:
                return run(*args, grid=grid, warmup=warmup, **kwargs)
            finally:
                counter.paused = paused

        return counted

    with wrap_triton_runs(modules, wrap):
        yield counter
