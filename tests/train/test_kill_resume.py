"""SIGKILL of a real `sparrow-train preset=tiny` in each phase of a step, then `resume=auto`.

One run is killed four times, each time in a different phase (rollout, update, checkpoint write
before the COMPLETE marker, checkpoint write before the rename) of a different step, and resumed
by the next launch; the fifth launch finishes. With a checkpoint after every step, each kill must
cost exactly the step in flight: the next launch resumes from the step before it, never from the
torn checkpoint, and the finished run must equal an uninterrupted one (every step's loss and
reward, the final weights byte for byte). The process is frozen in its phase by the test-only
wrapper pause_at.py, so the kill lands where it claims to, not where a timer happened to be.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.train.run.checkpoint import MARKER, verify

ROOT = Path(__file__).resolve().parents[2]
PAUSE_AT = Path(__file__).with_name("pause_at.py")
COMMON = ["preset=tiny", "rl.steps=6", "rl.save_every=1", "rl.keep_last=2", "rl.eval.every=0"]
KILLS = [("rollout", 2), ("update", 3), ("checkpoint", 4), ("rename", 5)]  # (phase, step)
# A fresh single-process run: no rendezvous variables left by in-process tests.
_DIST = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
ENV = {k: v for k, v in os.environ.items() if k not in _DIST}
ENV |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _launch(cmd: list[str], log: Path) -> subprocess.Popen:
    # Own session: the kill takes the whole process group, as a lost node would.
    with open(log.with_suffix(".out"), "w") as out, open(log.with_suffix(".err"), "w") as err:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=ENV, stdout=out, stderr=err, start_new_session=True
        )


def _kill_in_phase(run_dir: Path, phase: str, step: int, log: Path) -> None:
    marker = log.with_suffix(".paused")
    cmd = [sys.executable, str(PAUSE_AT), phase, str(step), str(marker), *COMMON]
    proc = _launch([*cmd, f"run_dir={run_dir}"], log)
    deadline = time.monotonic() + HANG_GUARD_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not marker.exists():
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"never reached {phase} of step {step}: {log.with_suffix('.err').read_text()}")
    assert json.loads(marker.read_text()) == {"phase": phase, "step": step, "pid": proc.pid}
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL


def _rows_by_step(run_dir: Path) -> dict[int, dict]:
    """The last row logged for each step (a redone step is logged again)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows}


def _checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def _assert_torn_state(run_dir: Path, phase: str, step: int) -> None:
    """What the kill left on disk: the previous checkpoint intact, step `step` not saved."""
    previous = run_dir / "checkpoints" / f"step_{step - 1:06d}"
    assert verify(previous) is None
    assert not (run_dir / "checkpoints" / f"step_{step:06d}").exists()
    tmp = run_dir / "checkpoints" / f"step_{step:06d}.tmp"
    if phase in ("rollout", "update"):
        assert not tmp.exists()
        assert max(_rows_by_step(run_dir)) == step - 1  # the step in flight was not logged
    else:  # a torn checkpoint: the actor's files are there, the marker only before the rename
        assert (tmp / "actor").is_dir()
        assert (tmp / MARKER).exists() == (phase == "rename")
        assert max(_rows_by_step(run_dir)) == step  # logged before the save began


@pytest.mark.slow
def test_sigkill_in_every_phase_loses_only_the_step_in_flight(tmp_path):
    straight = tmp_path / "straight"
    proc = _launch(
        [sys.executable, "-m", "sparrow.cli.train", *COMMON, f"run_dir={straight}"],
        tmp_path / "straight",
    )
    assert proc.wait(timeout=HANG_GUARD_S) == 0, (tmp_path / "straight.err").read_text()[-3000:]

    killed = tmp_path / "killed"
    for i, (phase, step) in enumerate(KILLS):
        log = tmp_path / f"launch{i}"
        _kill_in_phase(killed, phase, step, log)
        _assert_torn_state(killed, phase, step)
        if i > 0:  # this launch resumed after the previous kill
            prev_step = KILLS[i - 1][1]
            resumed = f"resumed from {killed / 'checkpoints' / f'step_{prev_step - 1:06d}'}"
            assert f"{resumed} at step {prev_step - 1}" in log.with_suffix(".out").read_text()

    last = tmp_path / "launch_final"
    proc = _launch([sys.executable, "-m", "sparrow.cli.train", *COMMON, f"run_dir={killed}"], last)
    assert proc.wait(timeout=HANG_GUARD_S) == 0, last.with_suffix(".err").read_text()[-3000:]
    out, err = last.with_suffix(".out").read_text(), last.with_suffix(".err").read_text()
    # The torn step-5 checkpoint (marker written, never renamed) is removed, not loaded.
    assert f"resumed from {killed / 'checkpoints' / 'step_000004'} at step 4" in out
    assert f"removing unfinished checkpoint {killed / 'checkpoints' / 'step_000005.tmp'}" in err

    # Nothing lost: every step is logged, with the uninterrupted run's numbers.
    expected, got = _rows_by_step(straight), _rows_by_step(killed)
    assert sorted(got) == sorted(expected) == [1, 2, 3, 4, 5, 6]
    for step in expected:
        for key in ("loss/loss", "reward/mean", "update/grad_norm", "rollout/tokens"):
            assert got[step][key] == expected[step][key], (step, key)
    assert _checkpoints(killed) == _checkpoints(straight) == ["step_000005", "step_000006"]
    assert verify(killed / "checkpoints" / "step_000006") is None
    weights = "policy/model.safetensors"
    assert (killed / weights).read_bytes() == (straight / weights).read_bytes()


DYNAMIC = [
    "preset=tiny",
    "rl.steps=4",
    "rl.save_every=1",
    "rl.eval.every=0",
    "rl.dynamic_sampling.enabled=true",
    "rl.dynamic_sampling.max_rounds=3",
    "rl.reward.name=test_half_signal",  # signal in about half the groups: steps need 2+ rounds
]


def _run_to_the_end(run_dir: Path, log: Path) -> None:
    cmd = [sys.executable, str(PAUSE_AT), "none", "0", str(log.with_suffix(".paused"))]
    proc = _launch([*cmd, *DYNAMIC, f"run_dir={run_dir}"], log)
    assert proc.wait(timeout=HANG_GUARD_S) == 0, log.with_suffix(".err").read_text()[-3000:]


@pytest.mark.slow
def test_sigkill_mid_round_of_dynamic_sampling_resumes_exactly(tmp_path):
    """Dynamic sampling draws a step's prompts over several rounds; a SIGKILL in the second
    round and resume=auto redo the step from its first round, with the same prompts and
    samples: the uninterrupted run's metrics and weights."""
    straight = tmp_path / "straight"
    _run_to_the_end(straight, tmp_path / "straight")
    expected = _rows_by_step(straight)
    # A step after the first, so that the resume starts from a checkpoint whose data position
    # already counts the earlier steps' extra rounds.
    step = min(s for s, r in expected.items() if s >= 2 and r["sampling/rounds"] >= 2)

    killed = tmp_path / "killed"
    marker = tmp_path / "kill.paused"
    cmd = [sys.executable, str(PAUSE_AT), "round", str(step), str(marker), *DYNAMIC]
    proc = _launch([*cmd, f"run_dir={killed}"], tmp_path / "kill")
    deadline = time.monotonic() + HANG_GUARD_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), (tmp_path / "kill.err").read_text()[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    logged = _rows_by_step(killed) if (killed / "metrics.jsonl").exists() else {}
    assert max(logged, default=0) == step - 1  # the step in flight was not logged

    _run_to_the_end(killed, tmp_path / "resume")
    resumed = f"resumed from {killed / 'checkpoints' / f'step_{step - 1:06d}'}"
    assert resumed in (tmp_path / "resume.out").read_text()
    got = _rows_by_step(killed)
    assert sorted(got) == sorted(expected) == [1, 2, 3, 4]
    keys = ("loss/loss", "reward/mean", "update/grad_norm", "rollout/tokens")
    keys += tuple(k for k in expected[step] if k.startswith("sampling/"))
    for s in expected:
        for key in keys:
            assert got[s][key] == expected[s][key], (s, key)
    weights = "policy/model.safetensors"
    assert (killed / weights).read_bytes() == (straight / weights).read_bytes()


ASYNC = [
    "preset=tiny",
    "rl.steps=5",
    "rl.save_every=1",
    "rl.eval.every=0",
    "rl.async.staleness=1",
    "rl.reward.name=test_length",  # scores vary within groups: the weights really move
]


@pytest.mark.slow
def test_sigkill_with_the_next_rollout_in_flight_resumes_exactly(tmp_path):
    """rl.async.staleness=1 (issue 51 item 4): a SIGKILL in step 3's update while step 4's
    rollout runs in the producer's thread (both frozen there), then resume=auto, equals the
    uninterrupted run: every step's metrics and the final weights. The checkpoint of step 2
    holds step 3's finished draw (sampled by the weights of step 1), which the resumed run
    trains instead of drawing again; step 4's lost draw is redrawn from the same stream."""
    straight = tmp_path / "straight"
    cmd = [sys.executable, str(PAUSE_AT), "none", "0", str(tmp_path / "none.paused"), *ASYNC]
    proc = _launch([*cmd, f"run_dir={straight}"], tmp_path / "straight")
    assert proc.wait(timeout=HANG_GUARD_S) == 0, (tmp_path / "straight.err").read_text()[-3000:]
    expected = _rows_by_step(straight)

    killed = tmp_path / "killed"
    marker = tmp_path / "kill.paused"
    cmd = [sys.executable, str(PAUSE_AT), "overlap", "3", str(marker), *ASYNC]
    proc = _launch([*cmd, f"run_dir={killed}"], tmp_path / "kill")
    deadline = time.monotonic() + HANG_GUARD_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), (tmp_path / "kill.err").read_text()[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    _assert_torn_state(killed, "update", 3)
    import torch

    state = torch.load(killed / "checkpoints/step_000002/trainer_state.pt", weights_only=False)
    pending = state["pending_rollout"]["drawn"]  # step 3's draw (0-based 2), finished
    assert (pending.step, pending.version) == (2, 1)
    assert pending.sampled.train.rollout.batch.weight_version.tolist() == [1] * 16

    cmd = [sys.executable, str(PAUSE_AT), "none", "0", str(tmp_path / "none2.paused"), *ASYNC]
    proc = _launch([*cmd, f"run_dir={killed}"], tmp_path / "resume")
    assert proc.wait(timeout=HANG_GUARD_S) == 0, (tmp_path / "resume.err").read_text()[-3000:]
    resumed = f"resumed from {killed / 'checkpoints' / 'step_000002'} at step 2"
    assert resumed in (tmp_path / "resume.out").read_text()
    got = _rows_by_step(killed)
    assert sorted(got) == sorted(expected) == [1, 2, 3, 4, 5]
    keys = ("loss/loss", "reward/mean", "update/grad_norm", "rollout/tokens", "accept/p5_min")
    keys += ("async/staleness", "correction/weight_max", "correction/weight_min")
    for s in expected:
        for key in keys:
            assert got[s][key] == expected[s][key], (s, key)
    assert [expected[s]["async/staleness"] for s in expected] == [0.0, 1.0, 1.0, 1.0, 1.0]
    weights = "policy/model.safetensors"
    assert (killed / weights).read_bytes() == (straight / weights).read_bytes()
