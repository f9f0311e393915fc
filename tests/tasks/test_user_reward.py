"""A user's reward named by `rl.reward.function` (sparrow/tasks/user_reward.py): loaded from a file
or a module, its kwargs bound, batched only when `batched` says so, guarded like the built-in
rewards (errors, non-finite scores and a batched return of the wrong length counted, never
raised), and with `isolate` run in a worker process that imports the file itself and is killed at
the deadline. The command-line side (one line and exit 2 before any model is loaded, a real
training run) is tests/cli/test_reward_function_cli.py."""

import json
import math
import os
import sys
from pathlib import Path

import pytest

from sparrow.tasks.rewards import RewardConfig, build_reward, score_batch
from sparrow.tasks.user_reward import RewardFunctionError, load_reward_function

MY_REWARD = Path(__file__).resolve().parents[1] / "data" / "my_reward.py"

# For the isolation tests: the worker's pid as the score shows where the call ran, and a
# completion "hang" sleeps past any deadline.
_WORKER_FILE = """
import os, time

def pid(prompt, completion, reference):
    return float(os.getpid())

def hangs(prompt, completion, reference):
    if completion == "hang":
        time.sleep(60)
    return 1.0
"""


def _reward(function: str, **fields):
    return build_reward(RewardConfig(function=function, **fields))


def test_a_file_reward_is_called_with_its_kwargs():
    reward = _reward(f"{MY_REWARD}:score", kwargs={"wrong": 0.25})
    assert reward.name == f"{MY_REWARD}:score"  # the failure warning names it
    assert reward("What is 7 + 34?", "7 + 34 = 41", "41").score == 1.0
    assert reward("What is 7 + 34?", "40", "41").score == 0.25
    assert reward.stats.calls == 2 and reward.stats.errors == 0


def test_a_module_reward_is_imported_by_name():
    reward = _reward("sparrow.tasks.rewards:exact_match")
    assert [reward("p", c, "41").score for c in ("41", "42")] == [1.0, 0.0]


def test_a_file_is_imported_once(tmp_path):
    counter = tmp_path / "imports.txt"
    path = tmp_path / "counted.py"
    path.write_text(f"open({str(counter)!r}, 'a').write('x')\ndef f(p, c, r):\n    return 1.0\n")
    for _ in range(3):  # the CLI's check and the trainer's build share the import
        load_reward_function(f"{path}:f", {}, batched=False)
    assert counter.read_text() == "x"


def test_a_batched_reward_gets_one_call_per_batch(tmp_path):
    log = tmp_path / "calls.jsonl"
    reward = _reward(
        f"{MY_REWARD}:score_all", batched=True, kwargs={"wrong": 0.5, "log_path": str(log)}
    )
    batch = score_batch(reward, ["q"] * 3, ["41", "x", "= 7"], ["41", "41", "7"])
    assert batch.scores.tolist() == [1.0, 0.5, 1.0]
    assert len(log.read_text().splitlines()) == 3 and batch.stats.calls == 3


@pytest.mark.parametrize(
    "returned, scores, errors, message",
    [
        ([1.0], [0.0] * 3, 3, "the batched reward returned 1 scores for 3 completions"),
        ("abc", [0.0] * 3, 3, "returns a list of 3 scores, got a str"),
        ([1.0, math.nan, 0.5], [1.0, 0.0, 0.5], 1, "non-finite score nan"),
    ],
)
def test_a_batched_reward_that_misbehaves_is_counted_not_raised(returned, scores, errors, message):
    # A function object's attributes cannot be set from RewardConfig: build the guard directly,
    # as build_reward does.
    from sparrow.tasks.reward_guard import GuardedReward

    reward = GuardedReward(lambda p, c, r: returned, "mine", timeout_s=None, batched=True)
    batch = score_batch(reward, ["q"] * 3, ["a", "b", "c"], ["r"] * 3)
    assert batch.scores.tolist() == scores
    assert batch.stats.errors == errors and batch.stats.calls == 3
    assert message in batch.stats.last_error


def test_batched_is_chosen_by_the_flag_not_guessed():
    # A batched function configured without batched=true is called per completion with strings:
    # it returns a list, which is no score, and each such call is counted as an error.
    reward = _reward(f"{MY_REWARD}:score_all")
    batch = score_batch(reward, ["q"] * 2, ["41", "41"], ["41", "41"])
    assert batch.scores.tolist() == [0.0, 0.0] and batch.stats.errors == 2


def test_an_isolated_reward_runs_in_a_worker_that_imports_the_file(tmp_path):
    path = tmp_path / "worker_reward.py"
    path.write_text(_WORKER_FILE)
    reward = _reward(f"{path}:pid", isolate=True)
    try:
        worker_pid = reward("p", "c", "r").score
    finally:
        reward.close()
    assert worker_pid not in (0.0, float(os.getpid())), reward.stats
    # The test process never imported the user's file.
    assert not any(str(path) == getattr(m, "__file__", None) for m in list(sys.modules.values()))


def test_an_isolated_reward_past_its_deadline_is_killed_and_counted(tmp_path):
    path = tmp_path / "worker_reward.py"
    path.write_text(_WORKER_FILE)
    reward = _reward(f"{path}:hangs", isolate=True, timeout_s=1.0)
    try:
        assert reward("p", "hang", "r").score == 0.0
        # Said of the user's function, not of sparrow's internal _call_in_worker.
        assert reward.stats.last_error == f"{path}:hangs: hangs took over 1.0 s"
        assert reward.stats.timeouts == 1
        assert reward("p", "fine", "r").score == 1.0  # a fresh worker imported the file again
    finally:
        reward.close()


def test_an_isolated_batched_reward(tmp_path):
    reward = _reward(f"{MY_REWARD}:score_all", isolate=True, batched=True, kwargs={"wrong": 0.1})
    try:
        batch = score_batch(reward, ["q"] * 2, ["41", "no"], ["41", "41"])
    finally:
        reward.close()
    assert batch.scores.tolist() == pytest.approx([1.0, 0.1]) and batch.stats.errors == 0


def test_an_isolated_reward_that_cannot_be_imported_is_refused_in_one_line(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import no_such_package_for_sparrow\n")
    with pytest.raises(RewardFunctionError) as caught:
        _reward(f"{path}:score", isolate=True)
    line = str(caught.value)
    assert "\n" not in line
    assert "raised ModuleNotFoundError: No module named 'no_such_package_for_sparrow'" in line


_ROOM_FILE = """
import json, os

def room(prompt, completion, reference, out):
    print("a print in the reward")
    with open(out, "w") as f:
        json.dump({"env": dict(os.environ), "cwd": os.getcwd()}, f)
    return 1.0
"""


def test_an_isolated_reward_runs_in_a_clean_room(tmp_path, monkeypatch, capfd):
    """The worker sees no secret of the trainer's environment (only the allow-list and the
    names passed through), works in a temporary directory of its own that is removed after,
    and prints to stderr: the trainer's stdout (step lines, sparrow-eval --json) stays clean.
    A relative reward path is taken from the trainer's directory, not the worker's."""
    for name, value in [("WANDB_API_KEY", "w-secret"), ("MY_TOKEN", "t-secret")]:
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("JUDGE_API_KEY", "passed on")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "room.py").write_text(_ROOM_FILE)
    out = tmp_path / "room.json"
    reward = _reward(
        "room.py:room", isolate=True, kwargs={"out": str(out)}, env_passthrough=["JUDGE_API_KEY"]
    )
    try:
        assert reward("p", "c", "r").score == 1.0, reward.stats.last_error
        worker_dir = Path(json.loads(out.read_text())["cwd"])
        assert worker_dir.is_dir() and worker_dir != tmp_path
    finally:
        reward.close()
    env = json.loads(out.read_text())["env"]
    assert "WANDB_API_KEY" not in env and "MY_TOKEN" not in env
    assert (env["JUDGE_API_KEY"], env["LC_ALL"]) == ("passed on", "C.UTF-8")
    assert env["PATH"] == os.environ["PATH"]
    assert not worker_dir.exists()  # removed with the worker
    printed = capfd.readouterr()
    assert "a print in the reward" in printed.err and "a print" not in printed.out
