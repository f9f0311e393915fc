"""The rollout producer of the asynchronous loop (`rl.async.staleness=1`): step t+1's rollout (and
its rewards and the monitor's same-weights dense replay) runs in a background thread while step t
updates the actor. torch's kernels release the GIL, so the engine's decode and the actor's
forward/backward share the cores instead of waiting for each other.

The trainer owns the weights' timing: it calls `wait()` before it changes the engine's weights,
so the engine never changes under a running generate, and the rows of step t+1 are those of the
weights before update t (one version old when step t+1 trains). One draw is in flight at most.

    pipeline = RolloutPipeline(draw)            # draw(step) -> DrawnStep, run in the thread
    pipeline.submit(step)                       # start drawing `step`'s rollout
    drawn = pipeline.result(step)               # wait for it and take it
    pipeline.wait()                             # before the engine's weights change
    state = pipeline.state_dict()               # a finished, untaken draw, for the checkpoint

Another producer (rollout ranks apart from the trainers) can replace this one: the trainer uses
only these five calls and the `DrawnStep` it hands back.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sparrow.monitor.same_weights import SameWeightsDense
from sparrow.train.dynamic_sampling import Sampled


@dataclass
class DrawnStep:
    """One step's rollout as the producer hands it over."""

    step: int  # the 0-based step it is for
    sampled: Sampled  # the rounds, the trained groups, their rewards (kept logits freed)
    version: int  # the weight version that sampled every row (its rows' batch.weight_version)
    same_weights: SameWeightsDense  # the trained rows' monitored share, on their own weights
    times: dict[str, float]  # async/<phase>_s of the draw in the thread (rollout, rewards, ...)


class RolloutPipeline:
    def __init__(self, draw: Callable[[int], DrawnStep]):
        """`draw(step)`: step `step`'s rollout, rewards and same-weights replay, on the engine's
        current weights (run in the producer's thread)."""
        self._draw = draw
        self._thread: threading.Thread | None = None
        self._done: DrawnStep | None = None
        self._error: BaseException | None = None
        self._step: int | None = None  # the step submitted or finished, not yet taken

    @property
    def pending(self) -> int | None:
        """The step of the draw in flight or finished and not taken; None when there is none."""
        return self._step

    def submit(self, step: int) -> None:
        """Start drawing `step`'s rollout in the background."""
        if self._step is not None:
            raise RuntimeError(f"step {self._step}'s rollout is still pending, not {step}'s")
        self._step = step
        self._thread = threading.Thread(
            target=self._run, args=(step,), name=f"rollout-{step}", daemon=True
        )
        self._thread.start()

    def wait(self) -> float:
        """Block until the draw in flight (if any) has finished; returns the seconds waited.
        A draw that failed raises its error here."""
        start = time.perf_counter()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error, self._step = self._error, None, None
            raise error
        return time.perf_counter() - start

    def result(self, step: int) -> DrawnStep:
        """`step`'s rollout, drawn now if nothing was submitted for it."""
        if self._step is None:
            self.submit(step)
        if self._step != step:
            raise RuntimeError(f"step {self._step}'s rollout is pending, step {step} asked")
        self.wait()
        done, self._done, self._step = self._done, None, None
        assert done is not None, "a finished draw without an error left its result"
        return done

    def close(self) -> None:
        """The loop is over: wait for a draw in flight (none is submitted past the last step)."""
        self.wait()

    def state_dict(self) -> dict | None:
        """The finished draw not yet taken (waits for one in flight), or None: what a resumed
        run trains next instead of drawing it again (its prompts and sampling calls are spent)."""
        self.wait()
        return None if self._done is None else {"drawn": self._done}

    def load_state_dict(self, state: dict | None) -> None:
        self.wait()
        self._done = None if state is None else state["drawn"]
        self._step = None if self._done is None else self._done.step

    def _run(self, step: int) -> None:
        try:
            self._done = self._draw(step)
        except BaseException as err:  # handed to the trainer's thread by wait()
            self._error = err
