"""The reward guard's edges (sparrow/tasks/reward_guard.py, issue 66 items 1-3): a batched reward
that returns MORE scores than completions is refused like a short list (its batch scores 0 and
is counted, never cut to length); an infinite score is an error like NaN (0, counted, never
trained on), per completion and inside a batch; and a batched call's deadline is
`rl.reward.timeout_s` times its batch (docs/guide/, "Your reward"), in this process and in an
isolated worker: a batch slower than one completion's deadline but within the batch's is no
timeout."""

import math
import threading
import time

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.tasks.reward_guard import GuardedReward, score_batch
from sparrow.tasks.reward_result import RewardResult
from sparrow.tasks.rewards import RewardConfig, build_reward

# For the isolated deadline: the worker imports this file itself.
_SLOW_FILE = """
import time

def slow_all(prompts, completions, references, seconds):
    time.sleep(seconds)
    return [1.0] * len(completions)
"""


def _batched(returned) -> GuardedReward:
    return GuardedReward(lambda p, c, r: returned, "mine", timeout_s=None, batched=True)


@pytest.mark.parametrize("extra", [1, 3])
def test_a_batched_reward_returning_more_scores_than_completions_scores_the_batch_zero(extra):
    reward = _batched([1.0] * (3 + extra))
    batch = score_batch(reward, ["q"] * 3, ["a", "b", "c"], ["r"] * 3)
    assert batch.scores.tolist() == [0.0, 0.0, 0.0]  # not the first three of the list
    assert batch.stats.calls == 3 and batch.stats.errors == 3 and batch.stats.timeouts == 0
    assert f"returned {3 + extra} scores for 3 completions" in batch.stats.last_error
    assert reward.stats.errors == 3  # the guard's totals count them too


@pytest.mark.parametrize("value", [math.inf, -math.inf, RewardResult(math.inf), math.nan])
def test_an_infinite_score_is_an_error_like_nan(value):
    reward = GuardedReward(lambda p, c, r: value, "mine", timeout_s=None)
    batch = score_batch(reward, ["q"] * 2, ["a", "b"], ["r"] * 2)
    assert batch.scores.tolist() == [0.0, 0.0]
    assert batch.stats.errors == 2 and batch.stats.timeouts == 0
    assert "non-finite score" in batch.stats.last_error
    assert all(extras == {"error": 1.0} for extras in batch.extras)


@pytest.mark.parametrize("bad", [math.inf, -math.inf])
def test_an_infinite_item_of_a_batch_scores_zero_alone(bad):
    batch = score_batch(_batched([1.0, bad, 0.5]), ["q"] * 3, ["a", "b", "c"], ["r"] * 3)
    assert batch.scores.tolist() == [1.0, 0.0, 0.5]
    assert batch.stats.errors == 1 and f"non-finite score {bad}" in batch.stats.last_error


# One completion's deadline is TIMEOUT_S; the batch of N gets N times that. The reward sleeps
# SLEEP_S: always past one completion's deadline (sleep never returns early), and far inside the
# batch's however slow the machine.
TIMEOUT_S, N, SLEEP_S = 0.3, 60, 1.0


def test_a_batched_call_has_timeout_s_per_completion_of_its_batch():
    released = threading.Event()

    def slow_all(prompts, completions, references):
        time.sleep(SLEEP_S)
        return [1.0] * len(completions)

    reward = GuardedReward(slow_all, "slow", timeout_s=TIMEOUT_S, batched=True)
    batch = score_batch(reward, ["q"] * N, ["c"] * N, ["r"] * N)
    assert batch.stats.timeouts == 0, batch.stats.last_error
    assert batch.scores.tolist() == [1.0] * N and batch.stats.calls == N
    # Past the batch's deadline it is a timeout (the abandoned thread is released at the end).
    stuck = GuardedReward(
        lambda p, c, r: released.wait(HANG_GUARD_S), "stuck", TIMEOUT_S, batched=True
    )
    try:
        late = score_batch(stuck, ["q"] * 2, ["c"] * 2, ["r"] * 2)
    finally:
        released.set()
    assert late.stats.timeouts == 2 and late.scores.tolist() == [0.0, 0.0]
    assert f"took over {2 * TIMEOUT_S} s" in late.stats.last_error


def test_an_isolated_batched_call_has_timeout_s_per_completion_of_its_batch(tmp_path):
    path = tmp_path / "slow_reward.py"
    path.write_text(_SLOW_FILE)
    cfg = RewardConfig(
        function=f"{path}:slow_all",
        isolate=True,
        batched=True,
        timeout_s=TIMEOUT_S,
        kwargs={"seconds": SLEEP_S},
    )
    reward = build_reward(cfg)
    try:
        batch = score_batch(reward, ["q"] * N, ["c"] * N, ["r"] * N)
    finally:
        reward.close()
    assert batch.stats.timeouts == 0, batch.stats.last_error
    assert batch.scores.tolist() == [1.0] * N
