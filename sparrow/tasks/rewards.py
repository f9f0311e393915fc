"""Reward functions: the interface, the guard that keeps a bad reward from killing a run, batch
scoring, and the registry of rewards by name.

A reward function is any callable `(prompt, completion, reference) -> RewardResult` (a plain
float or bool is accepted too). `GuardedReward` wraps one: an exception, a `RewardTimeout`, a
deadline overrun or a non-finite score is counted in `RewardStats` and scores 0, so a faulty
reward degrades a step's signal instead of ending the run. `score_batch` scores a whole rollout
and returns the scores as a tensor with the step's counts.

Registered rewards: "math" (math_verifier.MathVerifier, the default), "exact_match", and "chain"
(chain.chain_reward: partial credit for the chain task's working).
"""

import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sparrow.tasks.chain import chain_reward
from sparrow.tasks.reward_result import RewardFn, RewardResult, RewardTimeout


@dataclass
class RewardConfig:
    name: str = "math"  # registered reward: "math", "exact_match", "chain" or "length" (plumbing)
    timeout_s: float = 5.0  # per-completion deadline; overruns score 0 and are counted
    answer_fallback: str = (
        "last_number"  # math: without a \boxed{}, use the last number ("none": 0)
    )


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
    """A reward function that never raises and never runs past `timeout_s`.

    Rewards that enforce their own deadline (`enforces_timeout = True`, e.g. the math verifier)
    are called directly; others run in a daemon thread that is abandoned at the deadline. A
    thread cannot be killed, and one stuck inside a C call that holds the GIL stalls the caller
    too, which is why the math verifier uses a killable worker process instead.
    """

    def __init__(self, fn: RewardFn, name: str, timeout_s: float | None = 5.0):
        self.fn = fn
        self.name = name
        self.timeout_s = None if getattr(fn, "enforces_timeout", False) else timeout_s
        self.stats = RewardStats()  # totals over the guard's lifetime

    def __call__(self, prompt: str, completion: str, reference: str) -> RewardResult:
        return self.score(prompt, completion, reference, self.stats)

    def score(
        self, prompt: str, completion: str, reference: str, stats: RewardStats
    ) -> RewardResult:
        """Score one completion, counting the call and any failure into `stats`."""
        stats.calls += 1
        try:
            result = self._call(prompt, completion, reference)
            if not isinstance(result, RewardResult):
                result = RewardResult(float(result))
            if not math.isfinite(result.score):
                raise ValueError(f"non-finite score {result.score}")
            return result
        except TimeoutError as e:  # RewardTimeout included
            stats.timeouts += 1
            stats.last_error = f"{self.name}: {e}"
            return RewardResult(0.0, {"timeout": 1.0})
        except Exception as e:  # any failure of user code scores 0; the count shows it
            stats.errors += 1
            stats.last_error = f"{self.name}: {type(e).__name__}: {e}"
            return RewardResult(0.0, {"error": 1.0})

    def _call(self, prompt: str, completion: str, reference: str) -> RewardResult | float:
        if self.timeout_s is None:
            return self.fn(prompt, completion, reference)
        outcome: list = []

        def target() -> None:
            try:
                outcome.append(("ok", self.fn(prompt, completion, reference)))
            except Exception as e:
                outcome.append(("error", e))

        worker = threading.Thread(target=target, daemon=True, name=f"reward-{self.name}")
        worker.start()
        worker.join(self.timeout_s)
        if not outcome:
            raise RewardTimeout(f"took over {self.timeout_s} s")
        status, value = outcome[0]
        if status == "error":
            raise value
        return value

    def close(self) -> None:
        if hasattr(self.fn, "close"):
            self.fn.close()


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
    results = [
        reward.score(p, c, r, stats)
        for p, c, r in zip(prompts, completions, references, strict=True)
    ]
    reward.stats.add(stats)
    scores = torch.tensor([r.score for r in results], dtype=torch.float32)  # (N,)
    return BatchScores(scores, [r.extras for r in results], stats)


def exact_match(prompt: str, completion: str, reference: str) -> RewardResult:
    """1.0 when the completion, unwrapped from one \\boxed{} and normalised, equals the reference.

    Normalisation: case, surrounding whitespace, runs of spaces and a trailing period; meant for
    short-answer tasks ("Answer with just the number."), not for free text.
    """
    answer = _normalise(re.sub(r"^\\boxed\{(.*)\}$", r"\1", completion.strip(), flags=re.S))
    return RewardResult(float(answer == _normalise(reference)), {"extracted": answer})


def length_reward(prompt: str, completion: str, reference: str) -> RewardResult:
    """A plumbing reward, not a task: the completion's length in characters over 64, capped at
    1 (TRL's quickstart trains on a length reward the same way). A random model scores 0 on
    every task, so its advantages are all zero and no update moves it; under this reward its
    completions differ, and the smoke preset's two steps really train."""
    return RewardResult(min(len(completion), 64) / 64.0)


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().rstrip(".").strip().lower())


def _math_reward(cfg: RewardConfig) -> RewardFn:
    # Deferred so that importing the registry does not import SymPy.
    from sparrow.tasks.math_verifier import MathVerifier

    return MathVerifier(timeout_s=cfg.timeout_s, fallback=cfg.answer_fallback)


REWARDS: dict[str, Callable[[RewardConfig], RewardFn]] = {
    "math": _math_reward,
    "exact_match": lambda cfg: exact_match,
    "chain": lambda cfg: chain_reward,
    "length": lambda cfg: length_reward,
}


def register_reward(name: str, factory: Callable[[RewardConfig], RewardFn]) -> None:
    """Make a reward available by name to `build_reward`; the factory gets the RewardConfig."""
    if name in REWARDS:
        raise ValueError(f"reward {name!r} is already registered")
    REWARDS[name] = factory


def build_reward(cfg: RewardConfig) -> GuardedReward:
    """The guarded reward named by `cfg.name`."""
    if cfg.name not in REWARDS:
        raise ValueError(f"unknown reward {cfg.name!r}; registered: {sorted(REWARDS)}")
    return GuardedReward(REWARDS[cfg.name](cfg), cfg.name, timeout_s=cfg.timeout_s)
