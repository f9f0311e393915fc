"""SIGTERM / SIGINT to the real `sparrow-train` outside the step loop: one line, exit 128 +
signal, nothing half-written (slow: a tiny run each).

Inside the step loop a signal is deferred to the end of the step (tests/train/
test_graceful_stop.py). Here the process is frozen by pause_at.py at start-up after the model
load, in the step-0 evaluation, and in the final export between the weights and the tokenizer,
and signalled there; it used to die with no line (rc -15), leaving a half-written `policy/`.
The handler itself is tested in test_interruption.py, the export in test_policy_export.py.
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

ROOT = Path(__file__).resolve().parents[2]
PAUSE_AT = ROOT / "tests" / "train" / "pause_at.py"
_DIST = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
ENV = {k: v for k, v in os.environ.items() if k not in _DIST}
ENV |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
COMMON = ["preset=tiny", "rl.steps=1", "rl.eval.every=1", "rl.reward.name=test_length"]
STARTUP = (
    "stopped by {sig} during start-up; no step was in flight; run the same command again to "
    "start (resume=auto)"
)


def _signal_when_paused(phase: str, run_dir: Path, log: Path, sig=signal.SIGTERM):
    """Launch pause_at.py frozen at `phase`, send `sig` there; (exit code, stderr)."""
    marker = log.with_suffix(".paused")
    cmd = [sys.executable, str(PAUSE_AT), phase, "0", str(marker), *COMMON, f"run_dir={run_dir}"]
    with open(log.with_suffix(".err"), "w") as err:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
    deadline = time.monotonic() + HANG_GUARD_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not marker.exists():
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"never reached {phase}: {log.with_suffix('.err').read_text()[-3000:]}")
    os.kill(proc.pid, sig)
    try:
        code = proc.wait(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return code, log.with_suffix(".err").read_text()


def _train(run_dir: Path, marker: Path) -> subprocess.CompletedProcess:
    """An uninterrupted launch (pause_at.py registers the test_length reward)."""
    cmd = [sys.executable, str(PAUSE_AT), "none", "0", str(marker), *COMMON, f"run_dir={run_dir}"]
    done = subprocess.run(
        cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _last_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith("sparrow-train:")]
    assert len(lines) == 1 and stderr.rstrip().endswith(lines[0]), stderr[-3000:]
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "phase, sig", [("load", signal.SIGTERM), ("eval", signal.SIGTERM), ("eval", signal.SIGINT)]
)
def test_signal_during_start_up_is_one_line_and_128_plus_signal(tmp_path, phase, sig):
    code, stderr = _signal_when_paused(phase, tmp_path / "run", tmp_path / "launch", sig)
    assert code == 128 + sig, stderr[-3000:]
    name = signal.Signals(sig).name
    assert _last_line(stderr) == "sparrow-train: " + STARTUP.format(sig=name)
    assert not (tmp_path / "run" / "checkpoints").exists() or not any(
        p.name.startswith("step_") for p in (tmp_path / "run" / "checkpoints").iterdir()
    )


@pytest.mark.slow
def test_signal_during_the_export_leaves_no_half_policy_and_a_rerun_writes_it(tmp_path):
    run_dir = tmp_path / "run"
    code, stderr = _signal_when_paused("export", run_dir, tmp_path / "launch")
    assert code == 143, stderr[-3000:]
    assert _last_line(stderr) == (
        "sparrow-train: stopped by SIGTERM during the policy export; checkpoint step_000001 "
        f"holds the trained weights; run the same command again to write {run_dir / 'policy'}"
    )
    assert not (run_dir / "policy").exists() and not (run_dir / "policy.tmp").exists()
    assert verify(run_dir / "checkpoints" / "step_000001") is None

    again = _train(run_dir, tmp_path / "none.paused")
    assert f"resumed from {run_dir / 'checkpoints' / 'step_000001'} at step 1" in again.stdout
    straight = tmp_path / "straight"
    _train(straight, tmp_path / "none.paused")
    weights = "policy/model.safetensors"
    assert (run_dir / weights).read_bytes() == (straight / weights).read_bytes()
    assert (run_dir / "policy" / "tokenizer.json").is_file()
