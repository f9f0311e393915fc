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

from sparrow.train.rollouts.drawn import DrawnStep, PendingStep


class RolloutPipeline:
    def __init__(self, draw: Callable[[int], DrawnStep]):
        """`draw(step)`: step `step`'s rollout, rewards and same-weights replay, on the engine's
        current weights (run in the producer's thread)."""
        self._draw = draw
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._slot = PendingStep()

    @property
    def pending(self) -> int | None:
        """The step of the draw in flight or finished and not taken; None when there is none."""
        return self._slot.step

    def submit(self, step: int) -> None:
        """Start drawing `step`'s rollout in the background."""
        self._slot.start(step)
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
            error, self._error, self._slot.step = self._error, None, None
            raise error
        return time.perf_counter() - start

    def result(self, step: int) -> DrawnStep:
        """`step`'s rollout, drawn now if nothing was submitted for it."""
        if self._slot.step is None:
            self.submit(step)
        self._slot.check(step)
        self.wait()
        return self._slot.take()

    def close(self) -> None:
        """The loop is over: wait for a draw in flight (none is submitted past the last step)."""
        self.wait()

    def state_dict(self) -> dict | None:
        """The finished draw not yet taken (waits for one in flight), or None: what a resumed
        run trains next instead of drawing it again (its prompts and sampling calls are spent)."""
        self.wait()
        return self._slot.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        self.wait()
        self._slot.load_state_dict(state)

    def _run(self, step: int) -> None:
        try:
            self._slot.done = self._draw(step)
        except BaseException as err:  # handed to the trainer's thread by wait()
            self._error = err
