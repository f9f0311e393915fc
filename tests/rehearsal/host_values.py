"""Real values beside fake tensors for what the host knows: token ids, masks, lengths, group ids.

Fake tensors hold no values, so `int(lengths.max())` or `mask.nonzero()` cannot run on them, yet
the trainer's host-side bookkeeping reads such values by design (micro-batch cuts, the shared-
prompt layout, padding trims). `HostValues` (a TorchDispatchMode above `FakeTensorMode`) keeps a
real CPU tensor beside every integer or boolean fake tensor whose inputs all have one: factories
(`torch.full`, `torch.arange`, `torch.randint`, `torch.tensor(list)`) and what is computed from
them, up to `max_bytes` per op.
For such ops it also runs the real op (all modes off), so
- a value read back (`.item()`, `.tolist()`, `torch.equal`) returns the real value;
- an op whose output shape depends on values (`nonzero`, boolean-mask indexing) gets that shape;
while ops on activations (weights, hidden states, logits: no real value) stay fake, and reading
one of those back still fails (`HotPathGuard` names the site). Devices are the fake tensors';
the real values all live on the CPU.
"""

import torch
from torch._subclasses.fake_tensor import (
    DynamicOutputShapeException,
    FakeTensor,
    FakeTensorMode,
)
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_map_only
from torch.utils.weak import WeakIdKeyDictionary

aten = torch.ops.aten
# Ops whose output shape follows the values: with real inputs they run real and are faked after.
VALUE_SHAPED = {"nonzero", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
                "masked_select", "repeat_interleave", "_local_scalar_dense"}  # fmt: skip
CPU = torch.device("cpu")  # where every real value lives
MASK_INDEXING = {"index", "index_put", "index_put_", "_index_put_impl_"}  # indices: args[1]


def tensors_in(*groups) -> list[torch.Tensor]:
    """The tensors among aten arguments or outputs (a tensor, or a list or tuple of them)."""
    found = []
    for group in groups:
        for a in group:
            if isinstance(a, torch.Tensor):
                found.append(a)
            elif isinstance(a, (list, tuple)):
                found += [t for t in a if isinstance(t, torch.Tensor)]
    return found


class HostValues(TorchDispatchMode):
    def __init__(self, fake_mode: FakeTensorMode, max_bytes: int = 64 * 2**20):
        super().__init__()
        self.fake_mode = fake_mode
        self.max_bytes = max_bytes
        self.real = WeakIdKeyDictionary()  # fake tensor -> its real CPU value
        self.ops_run_real = 0

    def value(self, t: torch.Tensor) -> torch.Tensor | None:
        """The real value of fake tensor `t`, or None when only the device would know it."""
        return self.real.get(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = tensors_in(args, kwargs.values())
        # Floats never have a real value (the common case: activations, weights).
        known = not any(t.dtype.is_floating_point for t in tensors) and all(
            t in self.real or not isinstance(t, FakeTensor) for t in tensors
        )
        name = func._opname
        if func.namespace == "aten" and name in MASK_INDEXING and not known:
            args = (args[0], self._long_indices(args[1]), *args[2:])
        if known and (name in VALUE_SHAPED or func is aten.equal.default):
            real = self._run_real(func, args, kwargs)
            return tree_map_only(torch.Tensor, self._fake_of, real)
        try:
            out = func(*args, **kwargs)
        except DynamicOutputShapeException:  # e.g. indexing with a boolean mask
            if not known:
                raise
            return tree_map_only(torch.Tensor, self._fake_of, self._run_real(func, args, kwargs))
        if not known:  # an in-place write of unknown values: what was known of its target is not
            if func._schema.is_mutable:
                for arg, schema in zip(args, func._schema.arguments, strict=False):
                    written = schema.alias_info is not None and schema.alias_info.is_write
                    if written and isinstance(arg, torch.Tensor) and arg in self.real:
                        del self.real[arg]
            return out
        outs = tensors_in((out,))
        # Random factories draw for real too: the draw is then the value.
        if outs and self._host_sized(outs):
            real = tensors_in((self._run_real(func, args, kwargs),))
            for fake, value in zip(outs, real, strict=True):
                self.real[fake] = value
        return out

    def _host_sized(self, outs: list[torch.Tensor]) -> bool:
        """Integer and boolean outputs (ids, masks, lengths) of at most `max_bytes`: floats are
        activations and weights, which only the device computes."""
        if any(t.dtype.is_floating_point or t.dtype.is_complex for t in outs):
            return False
        return sum(t.numel() * t.element_size() for t in outs) <= self.max_bytes

    def _run_real(self, func, args, kwargs):
        self.ops_run_real += 1
        real_args, real_kwargs = tree_map_only(FakeTensor, self.real.__getitem__, (args, kwargs))
        real_args, real_kwargs = tree_map_only(
            torch.device, lambda _: CPU, (real_args, real_kwargs)
        )
        real_kwargs.pop("pin_memory", None)
        with _disable_current_modes():
            return func(*real_args, **real_kwargs)

    def _fake_of(self, value: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
        fake = self.fake_mode.from_tensor(value)
        if device is not None and device.type != "cpu":
            fake = aten._to_copy.default(fake, device=device)
        self.real[fake] = value
        return fake

    def _long_indices(self, indices: list) -> list:
        """Boolean masks with a real value as the long indices they select (what aten.index
        does with a mask anyway), so that indexing an activation with one has a known shape."""
        out = []
        for index in indices:
            if index is None or index.dtype != torch.bool or index not in self.real:
                out.append(index)
                continue
            with _disable_current_modes():
                picks = self.real[index].nonzero().unbind(1)
            out += [self._fake_of(p, index.device) for p in picks]
        return out
