"""Rewards: answer extraction, math-verify equivalence, timeouts off the main thread, the guard
that turns failures into counted zeros, batch scoring and the registry."""

import math
import operator
import threading
import time

import pytest
import torch
from hang_guard import HANG_GUARD_S

from sparrow.tasks.math_verifier import MathVerifier, extract_answer, extract_boxed
from sparrow.tasks.rewards import (
    REWARDS,
    GuardedReward,
    RewardConfig,
    RewardResult,
    build_reward,
    exact_match,
    length_reward,
    register_reward,
    score_batch,
)
from sparrow.tasks.sandbox import Sandbox, SandboxError, SandboxTimeout

# Verified by hand: math-verify parses this quickly, then verify() against 1/2 did not return
# within 20 s (it evaluates the tower in C while holding the GIL), so only a kill can stop it.
HANGING = r"The answer is \boxed{9^{9^{9^{9}}}}."
TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def math_reward():
    """One guarded verifier (one worker process start) shared by the module's tests."""
    reward = build_reward(RewardConfig(name="math", timeout_s=TIMEOUT_S))
    yield reward
    reward.close()


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{\frac{1}{2}} done", r"\frac{1}{2}"),  # nested braces
        (r"\boxed{3} then \boxed{4}", "4"),  # several boxes: the last wins
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"\boxed{5} and a truncated \boxed{\frac{1", "5"),  # an unclosed box does not count
        (r"\fbox{7}", "7"),
        ("no box here", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text, fallback, expected",
    [
        ("7 + 34 = 41.", "last_number", ("41", "last_number")),
        ("It costs 1,234 dollars", "last_number", ("1234", "last_number")),
        ("x = -3", "last_number", ("-3", "last_number")),
        ("5-3", "last_number", ("3", "last_number")),
        ("half: 1/2", "last_number", ("1/2", "last_number")),
        (r"41 or \boxed{42}", "last_number", ("42", "boxed")),
        (r"\boxed{ } 9", "last_number", ("9", "last_number")),  # an empty box is no answer
        ("41", "none", None),
        ("no digits at all", "last_number", None),
    ],
)
def test_extract_answer(text, fallback, expected):
    assert extract_answer(text, fallback) == expected


@pytest.mark.parametrize(
    "completion, reference, score",
    [
        (r"\boxed{0.5}", "1/2", 1.0),
        (r"Half is \boxed{\frac{1}{2}}.", "0.5", 1.0),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),
        (r"First \boxed{3}, no wait, \boxed{4}", "4", 1.0),
        (r"First \boxed{4}, no wait, \boxed{3}", "4", 0.0),
        ("7 + 34 = 41", "41", 1.0),
        ("The answer is 41.", "42", 0.0),
        ("I do not know.", "41", 0.0),
    ],
)
def test_math_verifier_scores(math_reward, completion, reference, score):
    result = math_reward("prompt", completion, reference)
    assert result.score == score
    assert math_reward.stats.errors == 0 and math_reward.stats.timeouts == 0


def test_no_answer_scores_zero_and_says_so(math_reward):
    result = math_reward("p", "I do not know.", "41")
    assert result == RewardResult(0.0, {"answer_found": 0.0, "boxed": 0.0, "extracted": None})


def test_hanging_expression_times_out_off_the_main_thread_and_is_counted(math_reward):
    before = math_reward.stats.timeouts
    outcome = {}

    def score_in_thread():
        outcome["result"] = math_reward("p", HANGING, "1/2")

    # The verify itself never returns: the timeout's effect is the result.
    worker = threading.Thread(target=score_in_thread, daemon=True)
    worker.start()
    worker.join(HANG_GUARD_S)
    assert not worker.is_alive()
    assert outcome["result"].score == 0.0 and outcome["result"].extras == {"timeout": 1.0}
    assert math_reward.stats.timeouts == before + 1
    assert "9^{9^{9^{9}}}" in math_reward.stats.last_error
    # The killed worker was replaced: the verifier keeps working, from the main thread too.
    assert math_reward("p", r"\boxed{0.5}", "1/2").score == 1.0
    assert math_reward.fn.sandbox.num_restarts == 1


def test_sandbox_times_out_reports_errors_and_recovers():
    sandbox = Sandbox()
    try:
        # Cheap calls: their deadline is a hang guard (the worker's start is not charged to it).
        assert sandbox.call(operator.add, 2, 3, timeout_s=HANG_GUARD_S) == 5
        sleeper = sandbox._worker.process
        with pytest.raises(SandboxTimeout):
            sandbox.call(time.sleep, 600, timeout_s=0.3)
        # The deadline killed the sleeping worker (a signal) rather than waiting for it.
        assert sleeper.poll() is not None and sleeper.returncode < 0
        with pytest.raises(SandboxError, match="ZeroDivisionError"):
            sandbox.call(operator.truediv, 1, 0, timeout_s=HANG_GUARD_S)
        assert sandbox.call(operator.mul, 6, 7, timeout_s=HANG_GUARD_S) == 42
        assert sandbox.num_restarts == 1
        sandbox._worker.process.kill()  # dies while idle: replaced without failing a call
        sandbox._worker.process.wait()
        assert sandbox.call(operator.sub, 9, 2, timeout_s=HANG_GUARD_S) == 7
        assert sandbox.num_restarts == 2
    finally:
        sandbox.close()
    assert sandbox._worker.process.poll() is not None  # close() ends the worker


def _raises(prompt, completion, reference):
    raise RuntimeError("reward bug")


def test_raising_reward_is_counted_and_scores_zero():
    reward = GuardedReward(_raises, "buggy")
    result = reward("p", "c", "r")
    assert result.score == 0.0 and result.extras == {"error": 1.0}
    assert reward.stats.errors == 1 and reward.stats.calls == 1
    assert reward.stats.last_error == "buggy: RuntimeError: reward bug"


def test_slow_reward_hits_the_guard_deadline():
    release = threading.Event()
    finished = []

    def blocked(prompt, completion, reference):
        release.wait(HANG_GUARD_S)
        finished.append(1)
        return 1.0

    reward = GuardedReward(blocked, "sleepy", timeout_s=0.2)
    try:
        # The guard returned while the reward was still blocked: it kept the deadline.
        assert reward("p", "c", "r").score == 0.0 and not finished
        assert reward.stats.timeouts == 1 and reward.stats.errors == 0
    finally:
        release.set()


def test_plain_float_is_accepted_and_nan_is_an_error():
    assert GuardedReward(lambda p, c, r: 0.25, "f")("p", "c", "r").score == 0.25
    nan_reward = GuardedReward(lambda p, c, r: math.nan, "nan")
    assert nan_reward("p", "c", "r").score == 0.0 and nan_reward.stats.errors == 1


def test_score_batch_returns_a_tensor_and_per_batch_counts():
    def flaky(prompt, completion, reference):
        if completion == "boom":
            raise ValueError("boom")
        return RewardResult(float(completion == reference), {"length": float(len(completion))})

    reward = GuardedReward(flaky, "flaky", timeout_s=None)
    batch = score_batch(reward, ["p"] * 4, ["4", "5", "boom", "4"], ["4", "4", "4", "4"])
    assert batch.scores.dtype == torch.float32 and batch.scores.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert batch.extras[1] == {"length": 1.0} and batch.extras[2] == {"error": 1.0}
    assert (batch.stats.calls, batch.stats.errors) == (4, 1)
    score_batch(reward, ["p"], ["boom"], ["4"])
    assert (reward.stats.calls, reward.stats.errors) == (5, 2)  # totals accumulate
    assert reward.stats.as_metrics()["reward/errors"] == 2.0
    with pytest.raises(ValueError, match="equal lengths"):
        score_batch(reward, ["p"], ["a", "b"], ["r"])


def test_exact_match_normalises_short_answers():
    assert exact_match("p", " 41. ", "41").score == 1.0
    assert exact_match("p", r"\boxed{Blue  Box}", "blue box").score == 1.0
    assert exact_match("p", "42", "41").score == 0.0
    assert exact_match("p", "The answer is 41", "41").score == 0.0


def test_registry_builds_by_name_and_rejects_unknown_or_duplicate_names():
    reward = build_reward(RewardConfig(name="exact_match"))
    assert isinstance(reward, GuardedReward) and reward("p", "41", "41").score == 1.0
    with pytest.raises(ValueError, match="unknown reward 'nope'.*exact_match"):
        build_reward(RewardConfig(name="nope"))
    with pytest.raises(ValueError, match="already registered"):
        register_reward("math", lambda cfg: exact_match)
    register_reward("always_one", lambda cfg: lambda p, c, r: 1.0)
    try:
        assert build_reward(RewardConfig(name="always_one"))("p", "c", "r").score == 1.0
    finally:
        del REWARDS["always_one"]


def test_math_verifier_rejects_an_unknown_fallback():
    with pytest.raises(ValueError, match="fallback"):
        MathVerifier(fallback="first_number")


def test_length_reward_scores_characters_up_to_64():
    scores = [length_reward("q", "x" * n, "a").score for n in (0, 16, 64, 500)]
    assert scores == [0.0, 0.25, 1.0, 1.0]
    assert build_reward(RewardConfig(name="length"))("q", "x" * 32, "a").score == 0.5
