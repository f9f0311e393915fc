"""An in-process reward that overruns its deadline, and one that calls sys.exit (issue 61 items 3
and 7).

A thread cannot be killed: each completion of a reward spinning in Python (`while True`,
`rl.reward.isolate=false`) left a thread taking its share of the GIL, and a 10-second run took
7 min 36 s. Now the guard raises an exception in the abandoned thread (a Python spin ends) and
the first overrun is the last in this process: a user's function goes on in a worker killed at
each deadline, any other reward is not called again; one warning says so. Shown by counting where
the calls ran and which threads are left, not by timing. `sys.exit()` in a reward was counted
and reported as a timeout (the thread died without a result); it is an error naming the exit."""

import os
import sys
import threading

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.tasks.reward_guard import GuardedReward
from sparrow.tasks.rewards import RewardConfig, build_reward, score_batch
from sparrow.tasks.user_reward import _FILE_MODULES

_SPIN_FILE = """
import os

CALLS = []  # the pids of the calls that ran this copy of the module


def spin(prompt, completion, reference):
    CALLS.append(os.getpid())
    while True:
        pass
"""


def _reward_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("reward-")]


def test_a_spinning_reward_overruns_once_in_process_then_runs_in_a_worker(tmp_path, caplog):
    path = tmp_path / "spin.py"
    path.write_text(_SPIN_FILE)
    before = set(_reward_threads())
    reward = build_reward(RewardConfig(function=f"{path}:spin", timeout_s=0.5))
    try:
        batch = score_batch(reward, ["p"] * 3, ["a", "b", "c"], ["r"] * 3)
        # Each completion cost one deadline: the first here, the others in a worker killed at
        # theirs (killed twice, so restarted twice).
        assert batch.stats.timeouts == 3 and batch.scores.tolist() == [0.0] * 3
        assert reward.fn.sandbox.num_restarts == 2
    finally:
        reward.close()
    assert _FILE_MODULES[str(path)].CALLS == [os.getpid()]  # one call ran in this process
    for thread in set(_reward_threads()) - before:  # the abandoned thread stopped spinning
        thread.join(HANG_GUARD_S)
        assert not thread.is_alive(), "the abandoned reward thread still runs"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"reward '{path}:spin' overran its 0.5 s deadline in this process, where it cannot be "
        "killed: it now runs in a worker process killed at the deadline, as with "
        "rl.reward.isolate=true (set it to start that way)"
    ]


def _spins(prompt, completion, reference):
    _SPINS.append(completion)
    while True:
        pass


_SPINS: list[str] = []


def test_a_registered_reward_that_overruns_is_not_called_again(caplog):
    reward = GuardedReward(_spins, "spinner", timeout_s=0.5)
    batch = score_batch(reward, ["p"] * 3, ["a", "b", "c"], ["r"] * 3)
    assert _SPINS == ["a"] and batch.stats.timeouts == 3
    assert "rl.reward.isolate=true" in batch.stats.last_error
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "it is not called again" in warnings[0], warnings


def _exits(prompt, completion, reference):
    sys.exit(3)


@pytest.mark.parametrize("timeout_s", [5.0, None], ids=["thread", "direct"])
def test_sys_exit_in_a_reward_is_an_error_that_names_the_exit(timeout_s):
    reward = GuardedReward(_exits, "exits", timeout_s=timeout_s)
    assert reward("p", "c", "r").score == 0.0  # and this process is still here
    assert (reward.stats.errors, reward.stats.timeouts) == (1, 0)
    assert reward.stats.last_error == "exits: SystemExit: the reward called sys.exit(3)"


def test_sys_exit_in_an_isolated_reward_fails_the_call_not_the_worker(tmp_path):
    path = tmp_path / "exits.py"
    path.write_text("import sys\n\ndef exits(p, c, r):\n    sys.exit(3)\n")
    reward = build_reward(RewardConfig(function=f"{path}:exits", isolate=True))
    try:
        assert [reward("p", "c", "r").score for _ in range(2)] == [0.0, 0.0]
        assert reward.fn.sandbox.num_restarts == 0  # the worker answered, not died
    finally:
        reward.close()
    assert (reward.stats.errors, reward.stats.timeouts) == (2, 0)
    assert "SystemExit: the call ran sys.exit(3)" in reward.stats.last_error
