"""Counting Triton JIT compiles, so that a benchmark can show none landed inside a timed step.

    with CompileWatch(modules) as watch:
        warm_up()
        before = watch.count
        timed_steps()
    compiles_in_timed_steps = watch.count - before

Compiled Triton (a GPU): Triton's own `jit_post_compile_hook`, called on a cache miss only, so
a launch that hits the cache costs nothing extra. Under TRITON_INTERPRET=1 nothing compiles; a
launch then counts as a compile when its specialisation key, what a compiled JIT keys its cache
on, is new: the constexpr values, the launch options, and per other argument its dtype and
16-byte alignment (tensors) or whether it is 1 and divisible by 16 (integers). The interpreter
count says which steps would compile on a GPU.
"""

import types
from collections import Counter

import torch

from sparrow.bench.dispatch_counter import wrap_triton_runs
from sparrow.kernels.compile_hook import MISSING, set_post_compile_hook


class CompileWatch:
    def __init__(self, modules: list[types.ModuleType], seen: set | None = None):
        """`seen`: the interpreter's keys met so far, shared by the watches of one process run
        (a compiled JIT caches a variant for the whole process)."""
        self.modules = modules
        self.count = 0  # compiles (or new specialisation keys) since entry
        self.by_kernel: Counter[str] = Counter()  # kernel name -> compiles
        self.counting = False  # whether compiles can be counted here (a Triton that says)
        self._keys: set[tuple] = set() if seen is None else seen

    def __enter__(self):
        kernels = [k for m in self.modules for k in vars(m).values() if _is_kernel(k)]
        self._wrap, self._hooked = None, False
        if any(type(k).__name__ == "InterpretedFunction" for k in kernels):
            self._wrap = wrap_triton_runs(self.modules, self._keyed)
            self._wrap.__enter__()
            self.counting = True
        elif kernels:  # compiled Triton (no modules: nothing launches Triton, nothing to watch)
            previous = set_post_compile_hook(self._hook)
            if previous is not MISSING:
                self._hooked, self._previous = True, previous
                self.counting = True
        return self

    def __exit__(self, *exc):
        if self._wrap is not None:
            return self._wrap.__exit__(*exc)
        if self._hooked:
            set_post_compile_hook(self._previous)
        return False

    def _hook(self, *args, **kwargs):
        self._count(getattr(kwargs.get("fn"), "name", "?"))  # triton's JitFunctionInfo
        if self._previous is not None:
            return self._previous(*args, **kwargs)
        return None

    def _keyed(self, name, kernel, run):
        params = list(kernel.fn.__code__.co_varnames[: kernel.fn.__code__.co_argcount])
        constexpr = {p for p, a in kernel.fn.__annotations__.items() if "constexpr" in str(a)}

        def watched(*args, grid, warmup, **kwargs):
            values = dict(zip(params, args, strict=False)) | kwargs
            key = (name,) + tuple(
                (p, values[p] if p in constexpr or p not in params else _spec(values[p]))
                for p in sorted(values, key=str)
            )
            if key not in self._keys:
                self._keys.add(key)
                self._count(name)
            return run(*args, grid=grid, warmup=warmup, **kwargs)

        return watched

    def _count(self, name: str) -> None:
        self.count += 1
        self.by_kernel[name] += 1


def _is_kernel(obj) -> bool:
    return type(obj).__name__ in ("JITFunction", "InterpretedFunction", "Autotuner")


def _spec(value):
    """What the JIT specialises a non-constexpr argument on."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value == 1, value % 16 == 0, -(2**31) <= value < 2**31)
    if isinstance(value, float):
        return ("float",)
    return (type(value).__name__,)
