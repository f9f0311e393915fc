"""Wall time of a step's phases: `with timer("update"): ...`; a phase entered twice adds up.

The phases tile the step: each phase is charged from the end of the one before it (the timer's
start for the first), so the gaps between `with` blocks are not lost and `time/step_s` is exactly
the sum of the phases, up to the end of the last one.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager


class PhaseTimer:
    def __init__(self):
        self.start = self.last = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        try:
            yield
        finally:
            now = time.perf_counter()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + now - self.last
            self.last = now

    def metrics(self) -> dict[str, float]:
        """`time/<phase>_s` per phase and `time/step_s`, the start to the last phase's end."""
        out = {f"time/{phase}_s": s for phase, s in self.seconds.items()}
        return out | {"time/step_s": self.last - self.start}
