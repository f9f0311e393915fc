"""A rank SIGKILLed mid-step in a 2-rank run (torchrun, gloo, CPU): the survivor stops with one
line, and the run resumes to exactly what an uninterrupted 2-rank run gives.

Both ranks are started by scripts/launch_multinode.sh (torchrun, c10d rendezvous) on this host.
Rank 1 is frozen by pause_at.py (PAUSE_AT_RANK=1) in the rollout or in the update of step 2 and
killed there; rank 0 meanwhile waits in the step's next collective. The survivor must exit by
itself (gloo sees the dead peer's closed connection at once; actor.collective_timeout_min, a hang
guard from tests/hang_guard.py, would end a rank that hung instead), with exit code 4
and a line saying a rank was lost and how to resume. Then:
- in the rollout case (MAX_RESTARTS=0, torchrun's `--max-restarts`) the launcher fails, ending
  with the survivor's line and its exit code 4 (not torchrun's traceback and 1), and launching
  the same command again resumes from step 1's checkpoint on both ranks;
- in the update case (MAX_RESTARTS=1) torchrun's elastic restart relaunches both ranks by
  itself, which resume the same way, and the one launch finishes.
Both runs must equal the uninterrupted one: every step's metrics (timings aside) and the final
weights byte for byte. Slow: five 2-rank launches, mostly start-up.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang_guard import COLLECTIVE_GUARD_MIN, HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]
PAUSE_AT = ROOT / "tests" / "train" / "pause_at.py"
TIMEOUT_MIN = COLLECTIVE_GUARD_MIN  # a 0.5 min one could trip on a rank still starting
COMMON = [
    "preset=tiny",
    "rl.steps=3",
    "rl.save_every=1",
    "rl.eval.every=0",
    "rl.reward.name=test_length",  # non-zero advantages: the weights really move
    "actor.micro_batch_size=4",  # 2 micro-batches per rank, for the pause inside the update
    f"actor.collective_timeout_min={TIMEOUT_MIN}",
]
# Wall-clock numbers differ run to run; everything else must be equal.
_TIMINGS = re.compile(r"^time/|_s$|tok_s|/tokens_per_s|^speedup/measured$|^memory/")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE"}}
    env = {k: v for k, v in env.items() if not k.startswith(("MASTER_", "TORCHELASTIC_"))}
    return env | {
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "HF_HUB_OFFLINE": "1",
        "PAUSE_AT_RANK": "1",
        # The checkout first, then what is there (the GPU check's offline wheels, DEPS_DIR).
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(run_dir: Path, phase: str, marker: Path, log: Path, restarts: int = 0):
    """scripts/launch_multinode.sh (torchrun, c10d rendezvous) with 2 ranks on this host."""
    env = _env() | {
        "PYTHON": sys.executable,
        "NPROC_PER_NODE": "2",
        "MASTER_PORT": str(_free_port()),
        "RDZV_ID": f"lost-rank-{os.getpid()}-{run_dir.name}",
        "MAX_RESTARTS": str(restarts),
        "SPARROW_ENTRY": str(PAUSE_AT),
    }
    cmd = ["bash", str(ROOT / "scripts" / "launch_multinode.sh"), phase, "2", str(marker)]
    with open(log, "w") as out:
        return subprocess.Popen(
            [*cmd, *COMMON, f"run_dir={run_dir}"], cwd=ROOT, env=env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _finish(proc: subprocess.Popen, log: Path) -> int:
    try:
        return proc.wait(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"torchrun did not finish:\n{log.read_text()[-4000:]}")


def _kill_rank1_when_paused(proc, marker: Path, log: Path) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if not marker.exists():
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"rank 1 never paused:\n{log.read_text()[-4000:]}")
    os.kill(json.loads(marker.read_text())["pid"], signal.SIGKILL)


def _survivor_line(log: Path, run_dir: Path, copies: int = 1) -> str:
    """The survivor's line, printed by rank 0 (and once more at the end by the launcher when the
    run fails: `copies=2`)."""
    lines = [ln for ln in log.read_text().splitlines() if "another rank was lost" in ln]
    assert len(lines) == copies and len(set(lines)) == 1, log.read_text()[-4000:]
    line = lines[0]
    assert line.startswith("sparrow-train: rank 0 of 2 stops: another rank was lost"), line
    assert f"resume=auto continues from the newest complete checkpoint in {run_dir}" in line
    return line


def _rows(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)), steps  # each step once
    return {r["step"]: {k: v for k, v in r.items() if not _TIMINGS.search(k)} for r in rows}


def _assert_same_run(got: Path, expected: Path) -> None:
    assert _rows(got) == _rows(expected)
    weights = "policy/model.safetensors"
    assert (got / weights).read_bytes() == (expected / weights).read_bytes()


@pytest.mark.slow
def test_lost_rank_stops_the_survivor_and_the_run_resumes_exactly(tmp_path):
    started = time.monotonic()
    straight = tmp_path / "straight"
    log = tmp_path / "straight.log"
    proc = _torchrun(straight, "none", tmp_path / "none.paused", log)
    assert _finish(proc, log) == 0, log.read_text()[-4000:]
    assert sorted(_rows(straight)) == [1, 2, 3]

    # Rank 1 dies in the rollout of step 2; torchrun gives up (no restarts).
    killed, log = tmp_path / "rollout", tmp_path / "rollout.log"
    marker = tmp_path / "rollout.paused"
    proc = _torchrun(killed, "rollout", marker, log)
    _kill_rank1_when_paused(proc, marker, log)
    # The survivor's code, not torchrun's 1; it saw the loss itself, not hung (_finish).
    assert _finish(proc, log) == 4, log.read_text()[-4000:]
    line = _survivor_line(log, killed, copies=2)
    # The launcher ends with that line, not torchrun's traceback and failure table.
    assert log.read_text().rstrip().splitlines()[-2:] == [
        "launch_multinode.sh: rank 0 exited with 4, rank 1 was killed by SIGKILL; rank 0 said:",
        line,
    ]
    assert "ChildFailedError" not in log.read_text()
    assert sorted(_rows(killed)) == [1]  # step 2 was in flight: not logged, not saved
    log = tmp_path / "rollout_resume.log"
    proc = _torchrun(killed, "rollout", marker, log)  # the marker exists: no pause this time
    assert _finish(proc, log) == 0, log.read_text()[-4000:]
    assert f"resumed from {killed / 'checkpoints' / 'step_000001'} at step 1" in log.read_text()
    _assert_same_run(killed, straight)

    # Rank 1 dies in the update of step 2; torchrun's elastic restart relaunches both ranks.
    restarted, log = tmp_path / "update", tmp_path / "update.log"
    marker = tmp_path / "update.paused"
    proc = _torchrun(restarted, "update", marker, log, restarts=1)
    _kill_rank1_when_paused(proc, marker, log)
    assert _finish(proc, log) == 0, log.read_text()[-4000:]
    _survivor_line(log, restarted)
    assert f"resumed from {restarted / 'checkpoints' / 'step_000001'} at step 1" in log.read_text()
    _assert_same_run(restarted, straight)
    print(f"lost-rank test wall time {time.monotonic() - started:.0f} s")
