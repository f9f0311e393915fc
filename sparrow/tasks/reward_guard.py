"""The guard that keeps a bad reward from killing a run, and batch scoring.

`GuardedReward` wraps a reward function: an exception, a `RewardTimeout`, a deadline overrun or a
non-finite score is counted in `RewardStats` and scores 0, so a faulty reward degrades a step's
signal instead of ending the run. A batched reward (`fn(prompts, completions, references) ->
list`, as TRL and verl allow) is guarded per call: a call that fails or returns a list of the
wrong length scores its whole batch 0 and counts every completion of it; a non-finite item
counts alone. `score_batch` scores a whole rollout and returns the scores as a tensor with the
step's counts.

A reward called in this process cannot be killed at its deadline: its thread is abandoned. At
the deadline the guard raises an exception inside that thread, which ends a reward spinning in
Python code (`while True`); one stuck in C code runs on, and each abandoned spinning thread took
its share of the GIL (a 10-second run took 7 minutes). So the first overrun is also the last in
this process: a user's function (`rl.reward.function`) goes on in an isolated worker that is
killed at the deadline, as with `rl.reward.isolate=true`, and any other reward is not called
again (each completion scores 0, counted as a timeout); one warning says which.
"""

import ctypes
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sparrow.tasks.reward_result import RewardFn, RewardResult, RewardTimeout

log = logging.getLogger(__name__)


@dataclass
class RewardStats:
    calls: int = 0  # completions scored
    errors: int = 0  # the reward raised or returned a non-finite score
    timeouts: int = 0  # the reward ran past its deadline
    last_error: str | None = None  # message of the most recent error or timeout

    def add(self, other: "RewardStats") -> None:
        self.calls += other.calls
        self.errors += other.errors
        self.timeouts += other.timeouts
        self.last_error = other.last_error or self.last_error

    def as_metrics(self) -> dict[str, float]:
        """Counts for the step logger."""
        return {
            "reward/calls": float(self.calls),
            "reward/errors": float(self.errors),
            "reward/timeouts": float(self.timeouts),
        }


class GuardedReward:
    """A reward function that never raises and never runs past its deadline.

    The deadline is `timeout_s` per completion (a batched call gets `timeout_s` times its batch
    size). Rewards that enforce their own deadline (`enforces_timeout = True`: the math verifier,
    an isolated user reward) are called directly; others run in a daemon thread that is abandoned
    at the deadline, once (see the module docstring: `isolated` is where they go on, if
    anywhere). A thread cannot be killed, and one stuck inside a C call that holds the GIL
    stalls the caller too, which is why those two use a killable worker process instead.
    `SystemExit` from a reward is an error of that call, never the trainer's exit.
    """

    def __init__(
        self,
        fn: RewardFn,
        name: str,
        timeout_s: float | None = 5.0,
        batched: bool = False,
        isolated: Callable[[], RewardFn] | None = None,
    ):
        self.fn = fn
        self.name = name
        self.timeout_s = None if getattr(fn, "enforces_timeout", False) else timeout_s
        self.batched = batched  # fn takes lists and returns one score per completion
        # After an overrun in this process: builds the same reward in a killable worker (an
        # `enforces_timeout` one), or None when there is no such form.
        self.isolated = isolated
        self.refused: str | None = None  # why the reward is no longer called, once it is not
        self.stats = RewardStats()  # totals over the guard's lifetime
        self._switch = threading.Lock()  # the rollout thread and an evaluation may both overrun

    def __call__(self, prompt: str, completion: str, reference: str) -> RewardResult:
        return self.score(prompt, completion, reference, self.stats)

    def score(
        self, prompt: str, completion: str, reference: str, stats: RewardStats
    ) -> RewardResult:
        """Score one completion, counting the call and any failure into `stats`."""
        return self.score_many([prompt], [completion], [reference], stats)[0]

    def score_many(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        references: Sequence[str],
        stats: RewardStats,
    ) -> list[RewardResult]:
        """Score each completion (one call of a batched reward, else one call each)."""
        if not self.batched:
            rows = zip(prompts, completions, references, strict=True)
            return [self._guarded(stats, 1, self.timeout_s, row)[0] for row in rows]
        n = len(completions)
        if n == 0:
            return []
        deadline = None if self.timeout_s is None else self.timeout_s * n
        batch = (list(prompts), list(completions), list(references))
        return self._guarded(stats, n, deadline, batch)

    def _guarded(
        self, stats: RewardStats, n: int, timeout_s: float | None, args: tuple
    ) -> list[RewardResult]:
        """n results of one call of the reward on `args`; failures counted, scored 0."""
        stats.calls += n
        try:
            value = self._call(timeout_s, args)
            values = _batch_of(value, n) if self.batched else [value]
        except TimeoutError as e:  # RewardTimeout included
            stats.timeouts += n
            stats.last_error = f"{self.name}: {e}"
            return [RewardResult(0.0, {"timeout": 1.0}) for _ in range(n)]
        except (Exception, SystemExit) as e:  # a failure of user code scores 0; counted
            return [self._failed(stats, e) for _ in range(n)]
        results = []
        for item in values:
            try:
                results.append(_as_result(item))
            except Exception as e:
                results.append(self._failed(stats, e))
        return results

    def _failed(self, stats: RewardStats, error: BaseException) -> RewardResult:
        stats.errors += 1
        what = f"{type(error).__name__}: {error}"
        if isinstance(error, SystemExit):  # not the trainer's exit, and no timeout either
            what = f"SystemExit: the reward called sys.exit({error.code!r})"
        stats.last_error = f"{self.name}: {what}"
        return RewardResult(0.0, {"error": 1.0})

    def _call(self, timeout_s: float | None, args: tuple) -> Any:
        if self.refused is not None:
            raise RewardTimeout(self.refused)
        if timeout_s is None:
            return self.fn(*args)
        fn = self.fn
        done, value = call_in_thread(fn, args, timeout_s, f"reward-{self.name}")
        if not done:
            self._overran(fn, timeout_s)
            raise RewardTimeout(f"took over {timeout_s} s")
        return value

    def _overran(self, fn: RewardFn, timeout_s: float) -> None:
        """The first overrun in this process: go on in a worker, or stop calling the reward."""
        with self._switch:
            if self.fn is not fn or self.refused is not None:  # another thread got here first
                return
            if getattr(fn, "enforces_timeout", False):  # already the worker (a racing caller)
                return
            advice = (
                "rl.reward.function=FILE:FN with rl.reward.isolate=true kills it at the deadline"
            )
            try:
                if self.isolated is None:
                    raise RuntimeError("it has no worker-process form")
                self.fn, self.timeout_s = self.isolated(), None
            except Exception as e:
                self.refused = (
                    f"not called again: it overran {timeout_s} s in this process ({advice})"
                )
                log.warning(
                    "reward %r overran its %s s deadline in this process and cannot go on in a "
                    "worker (%s): it is not called again, each completion scores 0 (%s)",
                    self.name, timeout_s, " ".join(str(e).split()), advice,
                )  # fmt: skip
                return
            log.warning(
                "reward %r overran its %s s deadline in this process, where it cannot be "
                "killed: it now runs in a worker process killed at the deadline, as with "
                "rl.reward.isolate=true (set it to start that way)",
                self.name, timeout_s,
            )  # fmt: skip

    def close(self) -> None:
        if hasattr(self.fn, "close"):
            self.fn.close()


class _Abandoned(BaseException):
    """Raised inside an abandoned reward thread, so that a spin in Python code ends there."""


def call_in_thread(fn: Callable, args: tuple, timeout_s: float, name: str) -> tuple[bool, Any]:
    """(True, fn(*args)) if it returns within `timeout_s` (its exception is raised here),
    else (False, None) with `_Abandoned` raised in the thread at its next Python bytecode."""
    lock = threading.Lock()
    state = {"running": True}
    outcome: list = []

    def target() -> None:
        try:
            try:
                result = ("ok", fn(*args))
            except (Exception, SystemExit) as e:  # handed to the caller's thread
                result = ("error", e)
            with lock:
                state["running"] = False
                outcome.append(result)
            _breaker()  # an _Abandoned sent just as fn returned is raised here, inside the try
        except _Abandoned:
            pass

    thread = threading.Thread(target=target, daemon=True, name=name)
    thread.start()
    thread.join(timeout_s)
    with lock:
        if state["running"]:  # past the deadline: stop it if it is running Python code
            assert thread.ident is not None, "a started thread has an id"
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread.ident), ctypes.py_object(_Abandoned)
            )
            return False, None
    status, value = outcome[0]
    if status == "error":
        raise value
    return True, value


def _breaker() -> None:
    """A Python call: the interpreter checks for a pending asynchronous exception on entry."""


def _as_result(value: Any) -> RewardResult:
    result = value if isinstance(value, RewardResult) else RewardResult(float(value))
    if not math.isfinite(result.score):
        raise ValueError(f"non-finite score {result.score}")
    return result


def _batch_of(value: Any, n: int) -> list:
    """A batched reward's return value as a list of n items, else the error that says why."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
        kind = type(value).__name__
        raise TypeError(f"a batched reward returns a list of {n} scores, got a {kind}")
    if len(value) != n:
        raise ValueError(f"the batched reward returned {len(value)} scores for {n} completions")
    return list(value)


@dataclass
class BatchScores:
    scores: torch.Tensor  # (N,) float32, one per completion
    extras: list[dict[str, Any]]  # per completion, from the reward
    stats: RewardStats  # counts for this batch only (the guard keeps the totals)


def score_batch(
    reward: GuardedReward,
    prompts: Sequence[str],
    completions: Sequence[str],
    references: Sequence[str],
) -> BatchScores:
    """Score N completions (prompts and references repeated per completion, e.g. per group)."""
    if not len(prompts) == len(completions) == len(references):
        raise ValueError(
            f"score_batch needs equal lengths, got {len(prompts)} prompts, "
            f"{len(completions)} completions, {len(references)} references"
        )
    stats = RewardStats()
    results = reward.score_many(prompts, completions, references, stats)
    reward.stats.add(stats)
    scores = torch.tensor([r.score for r in results], dtype=torch.float32)  # (N,)
    return BatchScores(scores, [r.extras for r in results], stats)
