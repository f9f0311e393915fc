"""Triton's post-compile hook, set and restored from outside kernels/ (a benchmark counting JIT
compiles: sparrow/bench/jit_compiles.py) without importing triton there.

    previous = set_post_compile_hook(hook)   # MISSING where this Triton has no such hook
    ...
    set_post_compile_hook(previous)
"""

MISSING = object()  # what set_post_compile_hook returns where the hook does not exist


def set_post_compile_hook(hook):
    """Install `hook` as Triton's `jit_post_compile_hook` (called on a cache miss only) and return
    the one it replaces, or MISSING (nothing installed) where this Triton has no such knob."""
    from triton import knobs

    if not hasattr(knobs.runtime, "jit_post_compile_hook"):
        return MISSING
    previous = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = hook
    return previous
