"""Live tensor bytes per device, and their peak per phase, of code run under fake tensors.

    with FakeTensorMode(), LiveBytes(phase_of=regions) as live:
        with live.phase("load"):
            ...
    live.phases["load"].peak["cuda"]   # bytes
    live.peak_in["prefill"]["cuda"]   # most bytes held while `regions()` said "prefill"

Phases are blocks of the caller's (`phase`), or whatever `phase_of()` names at each allocation
(a function of the call stack: the code under rehearsal needs no marks). A TorchDispatchMode
sees every op's outputs; each storage it has not seen is counted (its
`nbytes`) until the storage is freed, which a weakref finalizer reports (the storage's Python
object lives as long as the storage). Fake tensors allocate nothing, so this is what a device
allocator would hold: no allocator rounding, no caching, no workspace a kernel takes inside
an op (a fused attention's, a Triton op's split-KV partials). Only storages made while the mode
is active are counted: enter it before the code that allocates the resident state.
Imports nothing but torch: it can serve a memory plan outside the tests.
"""

import weakref
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

GIB = 2**30


@dataclass
class Phase:
    """Bytes per device type: held when the phase began and ended, and the most held at once."""

    start: Counter = field(default_factory=Counter)
    end: Counter = field(default_factory=Counter)
    peak: Counter = field(default_factory=Counter)
    ops: int = 0  # aten ops dispatched in the block: what it did, whatever the machine's speed

    def gib(self, device: str = "cuda") -> dict[str, float]:
        return {k: getattr(self, k)[device] / GIB for k in ("start", "peak", "end")}


class LiveBytes(TorchDispatchMode):
    def __init__(self, phase_of: Callable[[], str | None] | None = None):
        super().__init__()
        self.live = Counter()  # device type -> bytes held now
        self.peak = Counter()  # device type -> most bytes held at once since entering
        self.phase_of = phase_of
        self.peak_in: dict[str, Counter] = {}  # phase_of() -> device type -> peak bytes
        self.phases: dict[str, Phase] = {}
        self._open: list[Phase] = []
        self._seen: set[int] = set()  # ids of the storages counted in `live`

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for phase in self._open:
            phase.ops += 1
        for t in out if isinstance(out, (tuple, list)) else (out,):  # aten returns no nesting
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out

    def track(self, t: torch.Tensor) -> None:
        """Count `t`'s storage if it is new (tensors made outside the mode: call this)."""
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._seen:
            return
        device, nbytes = t.device.type, storage.nbytes()
        self._seen.add(key)
        weakref.finalize(storage, self._free, key, device, nbytes)
        self.live[device] += nbytes
        if self.live[device] > self.peak[device]:
            self.peak[device] = self.live[device]
        for phase in self._open:
            phase.peak[device] = max(phase.peak[device], self.live[device])
        name = self.phase_of() if self.phase_of else None
        if name is not None:
            peak = self.peak_in.setdefault(name, Counter())
            peak[device] = max(peak[device], self.live[device])

    def _free(self, key: int, device: str, nbytes: int) -> None:
        self._seen.discard(key)
        self.live[device] -= nbytes

    @contextmanager
    def phase(self, name: str):
        """Record the bytes held at the start and end of the block, and the peak within it."""
        record = Phase(start=Counter(self.live), peak=Counter(self.live))
        self.phases[name] = record
        self._open.append(record)
        try:
            yield record
        finally:
            self._open.remove(record)
            record.end = Counter(self.live)
