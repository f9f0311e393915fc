"""Reward functions: the config, the registry of rewards by name, and `build_reward`.

A reward function is any callable `(prompt, completion, reference) -> RewardResult` (a plain
float or bool is accepted too). `build_reward` wraps the one the config names in the guard of
reward_guard.py (failures and overruns counted and scored 0), which this module re-exports with
batch scoring.

Registered rewards: "math" (math_verifier.MathVerifier, the default), "exact_match", "chain"
(chain.chain_reward: partial credit for the chain task's working) and "length" (plumbing). A
user's own function is named by `function` instead (user_reward.py): no registration, no edit of
sparrow.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from sparrow.tasks.chain import chain_reward
from sparrow.tasks.reward_guard import BatchScores, GuardedReward, RewardStats, score_batch
from sparrow.tasks.reward_result import RewardFn, RewardResult
from sparrow.tasks.user_reward import build_user_reward, resolved_spec

__all__ = [
    "REWARDS",
    "BatchScores",
    "GuardedReward",
    "RewardConfig",
    "RewardResult",
    "RewardStats",
    "build_reward",
    "exact_match",
    "length_reward",
    "register_reward",
    "score_batch",
]


@dataclass
class RewardConfig:
    name: str = "math"  # registered reward: "math", "exact_match", "chain" or "length" (plumbing)
    timeout_s: float = 5.0  # per-completion deadline; overruns score 0 and are counted
    answer_fallback: str = (
        "last_number"  # math: without a \boxed{}, use the last number ("none": 0)
    )
    # A reward of your own, used instead of `name`: "path/to/file.py:fn" (a path from the current
    # directory) or "package.module:fn", called as fn(prompt, completion, reference, **kwargs) ->
    # float | RewardResult under the same guard. Checked before any model is loaded: a missing
    # file or function, an import error or a signature that does not fit exits 2 in one line.
    function: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)  # extra keyword arguments of `function`
    # true: fn(prompts, completions, references, **kwargs) -> one score per completion, one call
    # per batch (TRL's and verl's batched form), with a deadline of timeout_s per completion
    batched: bool = False
    # true: `function` runs in a worker process that imports the file itself and is killed at the
    # deadline (a hang inside C code, a crash or a leak cannot take the trainer with it). The
    # worker runs in a temporary directory of its own, prints to stderr, and sees only the
    # environment variables of sparrow.tasks.sandbox.WORKER_ENV (PATH, HOME, LANG, LC_*,
    # PYTHONPATH, TMPDIR, ...): no W&B, HF or cloud key
    isolate: bool = False
    # with `isolate`: names of more environment variables the worker sees (an API key the
    # reward needs, say: rl.reward.env_passthrough=[OPENAI_API_KEY])
    env_passthrough: list[str] = field(default_factory=list)


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
    from sparrow.tasks.math_verifier import AnswerFallback, MathVerifier

    fallback = cast(AnswerFallback, cfg.answer_fallback)  # MathVerifier checks the value
    return MathVerifier(timeout_s=cfg.timeout_s, fallback=fallback)


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
    """The guarded reward: the user's `cfg.function` when set, else the one named by `cfg.name`."""
    if cfg.function:

        def user(spec: str, isolate: bool) -> RewardFn:
            return build_user_reward(
                spec, cfg.kwargs, cfg.batched, isolate, cfg.timeout_s, cfg.env_passthrough
            )

        # Where an in-process function goes once it overruns its deadline (reward_guard.py);
        # its path is resolved now, from the directory the run started in.
        isolated = None if cfg.isolate else partial(user, resolved_spec(cfg.function), True)
        fn = user(cfg.function, cfg.isolate)
        return GuardedReward(fn, cfg.function, cfg.timeout_s, cfg.batched, isolated)
    if cfg.name not in REWARDS:
        raise ValueError(f"unknown reward {cfg.name!r}; registered: {sorted(REWARDS)}")
    return GuardedReward(REWARDS[cfg.name](cfg), cfg.name, timeout_s=cfg.timeout_s)
