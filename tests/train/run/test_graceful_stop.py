"""SIGTERM to a real `sparrow-train preset=smoke` in rollout and in update, then `resume=auto`.

What a preempted job needs: the process finishes the step in flight, checkpoints it (here with
rl.save_every=0, so the only checkpoint before the end is the one the signal asked for), closes
W&B and exits with 143 and one line saying how to resume; the resumed run ends with the same
weights as an uninterrupted one. The process is frozen in its phase by pause_at.py (PAUSE_AT_GO
mode), signalled there, and then let go, so the signal lands where the test says it does.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.train.run.checkpoint import verify
from sparrow.train.run.stop_in_loop import DUPLICATE_WINDOW_S

ROOT = Path(__file__).resolve().parents[3]
PAUSE_AT = Path(__file__).resolve().parents[1] / "pause_at.py"
STEPS = 3
COMMON = [
    "preset=smoke",
    f"rl.steps={STEPS}",
    "rl.save_every=0",
    "rl.eval.every=0",
    "rl.reward.name=test_length",  # non-zero advantages: the weights really move
]
_DIST = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
ENV = {k: v for k, v in os.environ.items() if k not in _DIST}
ENV |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PAUSE_AT_GO": "1"}


def _run(args: list[str], log: Path) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, str(PAUSE_AT), *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    log.with_suffix(".err").write_text(proc.stderr)
    return proc.returncode, proc.stdout, proc.stderr


def _sigterm_in(phase: str, step: int, run_dir: Path, log: Path) -> tuple[int, str]:
    marker = log.with_suffix(".paused")
    cmd = [sys.executable, str(PAUSE_AT), phase, str(step), str(marker), *COMMON]
    with open(log.with_suffix(".err"), "w") as err:
        proc = subprocess.Popen(
            [*cmd, f"run_dir={run_dir}"],
            cwd=ROOT,
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    deadline = time.monotonic() + HANG_GUARD_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not marker.exists():
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"never reached {phase} of step {step}: {log.with_suffix('.err').read_text()}")
    os.kill(proc.pid, signal.SIGTERM)  # the main process, as Kubernetes signals PID 1
    time.sleep(1.0)  # the handler runs while the process is still frozen in the phase
    marker.with_suffix(".go").touch()
    try:
        code = proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return code, log.with_suffix(".err").read_text()


def _final_weights(run_dir: Path) -> bytes:
    return (run_dir / "policy" / "model.safetensors").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("phase, step", [("rollout", 2), ("update", 1)])
def test_sigterm_checkpoints_the_step_in_flight_and_resumes_exactly(tmp_path, phase, step):
    straight = tmp_path / "straight"
    code, _, err = _run(
        ["none", "0", str(tmp_path / "x"), *COMMON, f"run_dir={straight}"], tmp_path / "straight"
    )
    assert code == 0, err[-3000:]

    stopped = tmp_path / "stopped"
    code, err = _sigterm_in(phase, step, stopped, tmp_path / "term")
    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    checkpoint = stopped / "checkpoints" / f"step_{step:06d}"
    last = [line for line in err.splitlines() if line.startswith("sparrow-train:")]
    assert last == [
        f"sparrow-train: stopped by SIGTERM after step {step}; checkpoint {checkpoint}; run the "
        "same command again (resume=auto) to continue"
    ], err[-3000:]
    assert verify(checkpoint) is None
    assert sorted(p.name for p in (stopped / "checkpoints").iterdir()) == [checkpoint.name]
    assert not (stopped / "policy").exists()  # stopped, not finished

    code, out, err = _run(
        ["none", "0", str(tmp_path / "y"), *COMMON, f"run_dir={stopped}"], tmp_path / "resumed"
    )
    assert code == 0, err[-3000:]
    assert f"resumed from {checkpoint} at step {step}" in out
    assert _final_weights(stopped) == _final_weights(straight)


@pytest.mark.slow
def test_second_sigterm_exits_at_once(tmp_path):
    marker = tmp_path / "paused"
    cmd = [sys.executable, str(PAUSE_AT), "update", "1", str(marker), *COMMON]
    proc = subprocess.Popen(
        [*cmd, f"run_dir={tmp_path / 'run'}"],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + HANG_GUARD_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.stderr.read() if proc.poll() is not None else "timeout"
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(DUPLICATE_WINDOW_S + 1.0)  # sooner, it would count as a copy of the first
    os.kill(proc.pid, signal.SIGTERM)  # never let go: only the second signal can end it
    try:
        code = proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = proc.stderr.read()
    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert "SIGTERM again: exiting now, without a checkpoint" in err
    assert not list((tmp_path / "run" / "checkpoints").glob("step_??????"))
