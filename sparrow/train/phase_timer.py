"""Wall time of a step's phases: `with timer("update"): ...`; a phase entered twice adds up. With
`memory` (memory/peaks.py; the trainer passes one with memory.measure_phases), also the most
memory each phase held.

The phases tile the step: each phase is charged from the end of the one before it (the timer's
start for the first), so the gaps between `with` blocks are not lost and `time/step_s` is exactly
the sum of the phases, up to the end of the last one.

Memory is not tiled: the peak is reset at a phase's entry and read at its exit, so a phase's
`memory/peak_gib/<phase>` is its own (the largest over its entries), not what an earlier phase
left as the high-water mark; a phase inside another also counts in the outer one.
`memory/resident_gib` is what the process held at the timer's start (the step's, before its
rollout). One reset and one read per phase: a file write and a small file read on the CPU.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager

from sparrow.train.memory.peaks import CudaPeaks, GiB, HostPeaks


class PhaseTimer:
    def __init__(self, memory: HostPeaks | CudaPeaks | None = None):
        self.start = self.last = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.memory = memory
        self.peaks: dict[str, int] = {}  # phase -> bytes at its peak, over its entries
        self.open: list[str] = []  # the phases entered and not left, innermost last
        self.resident = memory.read()[0] if memory is not None else None

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if self.memory is not None:
            self._credit()  # an outer phase keeps its peak so far: the reset below clears it
            self.memory.reset()
        self.open.append(phase)
        try:
            yield
        finally:
            now = time.perf_counter()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
            self.last = now
            if self.memory is not None:
                self._credit()
            self.open.pop()

    def _credit(self) -> None:
        """The peak since the last reset, to every open phase."""
        if not self.open:
            return
        assert self.memory is not None
        peak = self.memory.read()[1]
        for phase in self.open:
            self.peaks[phase] = max(self.peaks.get(phase, 0), peak)

    def metrics(self) -> dict[str, float]:
        """`time/<phase>_s` per phase and `time/step_s`, the start to the last phase's end; with
        `memory`, `memory/peak_gib/<phase>` per phase and `memory/resident_gib`."""
        out = {f"time/{phase}_s": s for phase, s in self.seconds.items()}
        out["time/step_s"] = self.last - self.start
        if self.resident is not None:
            out |= {f"memory/peak_gib/{phase}": b / GiB for phase, b in self.peaks.items()}
            out["memory/resident_gib"] = self.resident / GiB
        return out
