"""Step-level progress for the console: share done, time elapsed and an ETA.

Presets switch the rollout bar off, so the step line is where a person sees how far a run is.
The ETA is the mean duration of the steps this launch has run (a resumed launch counts from its
first step) times the steps left; the first step's warm-up makes it pessimistic at first.
"""

import time


class StepClock:
    def __init__(self, first_step: int, total_steps: int):
        self.first_step = first_step
        self.total_steps = total_steps
        self._start = time.monotonic()

    def line(self, step: int) -> str:
        """e.g. `40% | 2m05s elapsed, eta 3m08s` after `step` steps of the run are done."""
        elapsed = time.monotonic() - self._start
        done = step - self.first_step
        left = self.total_steps - step
        eta = format_duration(elapsed / done * left) if done > 0 else "?"
        share = step / max(self.total_steps, 1)
        return f"{share:.0%} | {format_duration(elapsed)} elapsed, eta {eta}"


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
