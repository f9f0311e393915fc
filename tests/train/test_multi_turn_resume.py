"""Multi-turn episodes where the rollout runs ahead or apart (issue 62), on real runs:
- `cluster.rollout_ranks=1` (a real 2-rank launch, test_rollout_ranks.py's): the environments run
  on the rollout rank, where the episodes are drawn; the run equals the one-process
  `rl.async.staleness=1` run (every step's metrics, timings aside, and the final weights byte for
  byte); the whole launch SIGKILLed while the rollout rank is frozen mid-draw (episodes in flight)
  and step 2's update is frozen resumes to exactly that run;
- `rl.async.staleness=1` in one process (test_kill_resume.py's): SIGKILL in step 3's update while
  the producer thread is mid-way through step 4's episodes, then resume=auto, equals the
  uninterrupted run.
Turns close on every other token id (pause_at.py's PAUSE_AT_STOP_EVERY), so the episodes reach
their second and third turns. Slow: seven launches.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import test_kill_resume as kill
import test_rollout_ranks as ranks
from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]
ENV = [f"env.function={ROOT / 'tests' / 'data' / 'scripted_env.py'}:make_env", "env.max_turns=3"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(the 2-rank run dir, the one-process run dir), with the patch still on for the tests."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ranks, "COMMON", [*ranks.COMMON, *ENV])
        patch.setenv("PAUSE_AT_STOP_EVERY", "2")
        root = tmp_path_factory.mktemp("multi_turn_ranks")
        straight, log = root / "straight", root / "straight.log"
        assert ranks._finish(ranks._launch(straight, log), log) == 0, log.read_text()[-4000:]
        assert "rollout rank 1: drew 3 steps for training ranks 0" in log.read_text()
        yield straight, ranks.one_process_run(root)


@pytest.mark.slow
def test_rollout_rank_episodes_equal_the_one_process_run(runs):
    straight, local = runs
    remote = ranks._rows(straight)
    assert [remote[s]["async/staleness"] for s in (1, 2, 3)] == [0.0, 1.0, 1.0]
    assert all(row["episode/turns_mean"] > 1 for row in remote.values())
    assert all(row["episode/observation_tokens_mean"] > 0 for row in remote.values())
    for row in remote.values():
        assert row.pop("sync/push_bytes") > 0
    assert remote == ranks._rows(local)
    assert ranks._weights(straight) == ranks._weights(local)


@pytest.mark.slow
def test_kill_with_episodes_in_flight_resumes_exactly(runs, tmp_path):
    straight, _ = runs
    run_dir, log = tmp_path / "overlap", tmp_path / "overlap.log"
    proc = ranks._launch(run_dir, log, "overlap", 2, rank=0)
    ranks._wait_for(log.with_suffix(".paused"), proc, log)
    for pid_file in (log.with_suffix(".paused"), log.with_suffix(".draw")):
        text = pid_file.read_text()
        os.kill(json.loads(text)["pid"] if text.startswith("{") else int(text), signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert sorted(ranks._rows(run_dir)) == [1]
    ranks._resumes_to(straight, run_dir, log)


@pytest.mark.slow
def test_async_kill_with_episodes_in_flight_resumes_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(kill, "ENV", kill.ENV | {"PAUSE_AT_STOP_EVERY": "2"})
    common = [*kill.ASYNC, *ENV]
    for name, phase in (("straight", "none"), ("killed", "overlap")):
        marker = tmp_path / f"{name}.paused"
        cmd = [sys.executable, str(kill.PAUSE_AT), phase, "3", str(marker), *common]
        proc = kill._launch([*cmd, f"run_dir={tmp_path / name}"], tmp_path / name)
        if phase == "none":
            assert proc.wait(timeout=HANG_GUARD_S) == 0, (tmp_path / f"{name}.err").read_text()
            continue
        deadline = time.monotonic() + HANG_GUARD_S
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), (tmp_path / f"{name}.err").read_text()[-3000:]
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        assert max(kill._rows_by_step(tmp_path / name)) == 2  # step 3 was in flight
        cmd = [sys.executable, str(kill.PAUSE_AT), "none", "0", str(marker) + "2", *common]
        proc = kill._launch([*cmd, f"run_dir={tmp_path / name}"], tmp_path / "resume")
        assert proc.wait(timeout=HANG_GUARD_S) == 0, (tmp_path / "resume.err").read_text()
    expected, got = (kill._rows_by_step(tmp_path / n) for n in ("straight", "killed"))
    assert sorted(got) == sorted(expected) == [1, 2, 3, 4, 5]
    assert all(row["episode/turns_mean"] > 1 for row in expected.values())
    keys = ("loss/loss", "reward/mean", "update/grad_norm", "rollout/tokens", "accept/p5_min")
    keys += ("episode/turns_mean", "episode/observation_tokens_mean", "async/staleness")
    for s in expected:
        for key in keys:
            assert got[s][key] == expected[s][key], (s, key)
    weights = "policy/model.safetensors"
    assert (tmp_path / "killed" / weights).read_bytes() == (
        tmp_path / "straight" / weights
    ).read_bytes()
