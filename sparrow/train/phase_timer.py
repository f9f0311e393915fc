"""Wall time of a step's phases: `with timer("update"): ...`; a phase entered twice adds up."""

import time
from collections.abc import Iterator
from contextlib import contextmanager


class PhaseTimer:
    def __init__(self):
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        """`time/<phase>_s` per phase and `time/step_s` since the timer was made."""
        out = {f"time/{phase}_s": s for phase, s in self.seconds.items()}
        return out | {"time/step_s": time.perf_counter() - self.start}
