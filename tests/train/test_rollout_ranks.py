"""`cluster.rollout_ranks=1` on a real 2-rank launch (scripts/launch_multinode.sh, torchrun,
gloo, CPU): world rank 1 runs only the engine, rank 0 trains and pushes its weights after every
update, with the next step's draw one step ahead (rl.async.staleness=1).

- The training rank's memory plan takes the host's whole RAM: the rollout rank beside it is
  not counted among the ranks that share it (the plan line says so).
- The run equals the one-process staleness-1 run: every step's metrics (timings aside; the push's
  own keys exist only here) and the final weights byte for byte. The rollout rank draws from each
  request what the trainer's own engine would have drawn (prompts, plan, schedule, seed).
- The rollout rank SIGKILLed mid-draw, or the training rank in its update: the other stops in
  one line with exit code 4, and the same command resumes to exactly the uninterrupted run.
- The whole launch SIGKILLed while step 3's draw (frozen mid-decode on the rollout rank) overlaps
  step 2's update (frozen after its first micro-batch): resume=auto gives exactly the same run.
Slow: nine launches, mostly start-up.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang_guard import COLLECTIVE_GUARD_MIN, HANG_GUARD_S
from test_lost_rank import _TIMINGS, _env, _finish, _free_port

ROOT = Path(__file__).resolve().parents[2]
PAUSE_AT = ROOT / "tests" / "train" / "pause_at.py"
# Hang guards (tests/hang_guard.py): a rollout rank waits on the bridge for the trainers' first
# push through their whole start-up, which a loaded host or a first run stretches past any short
# timeout; a lost peer closes its connection and is seen at once whatever the timeout.
TIMEOUT_MIN = COLLECTIVE_GUARD_MIN
BRIDGE_TIMEOUT_MIN = COLLECTIVE_GUARD_MIN
HOST_GIB = 16
COMMON = [
    "preset=tiny",
    "rl.steps=3",
    "rl.save_every=1",
    "rl.eval.every=0",
    "rl.reward.name=test_length",  # non-zero advantages: the weights really move
    "rl.async.staleness=1",
    "actor.micro_batch_size=4",  # several micro-batches, for the pause inside the update
    f"actor.collective_timeout_min={TIMEOUT_MIN}",
    f"cluster.bridge_timeout_min={BRIDGE_TIMEOUT_MIN}",
    # The host's RAM as the plan takes it, so that the plan line says whose share it sized
    # (on a 1 + 1 launch the one training rank's: all of it).
    f"memory.device_gib={HOST_GIB}",
]
PUSH_KEYS = ("sync/push_s", "sync/push_bytes")


def _launch(
    run_dir: Path, log: Path, phase="none", step=0, rank=None, extra=(), gpu=False
) -> subprocess.Popen:
    """Two ranks, the last rolling out; `phase`/`step`: where pause_at.py freezes world rank
    `rank` (None: any rank that reaches it); `extra`: more overrides; `gpu`: CUDA visible."""
    env = _env() | {
        "PYTHON": sys.executable,
        "NPROC_PER_NODE": "2",
        "MASTER_PORT": str(_free_port()),
        "RDZV_ID": f"rollout-ranks-{os.getpid()}-{run_dir.name}",
        "SPARROW_ENTRY": str(PAUSE_AT),
    }
    env.pop("PAUSE_AT_RANK")
    if gpu:
        env.pop("CUDA_VISIBLE_DEVICES")
    if rank is not None:
        env["PAUSE_AT_RANK"] = str(rank)
    marker = log.with_suffix(".paused")
    args = [phase, str(step), str(marker), *COMMON, "cluster.rollout_ranks=1", *extra]
    args.append(f"run_dir={run_dir}")
    with open(log, "a") as out:
        return subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "launch_multinode.sh"), *args], cwd=ROOT, env=env,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _rows(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)), steps  # each step once
    return {r["step"]: {k: v for k, v in r.items() if not _TIMINGS.search(k)} for r in rows}


def _weights(run_dir: Path) -> bytes:
    return (run_dir / "policy" / "model.safetensors").read_bytes()


def _wait_for(path: Path, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if not path.exists():
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"never reached {path.name}:\n{log.read_text()[-4000:]}")


def _resumes_to(straight: Path, run_dir: Path, log: Path) -> None:
    """The same command again resumes from step 1's checkpoint to exactly the straight run."""
    proc = _launch(run_dir, log)
    assert _finish(proc, log) == 0, log.read_text()[-4000:]
    assert f"resumed from {run_dir / 'checkpoints' / 'step_000001'} at step 1" in log.read_text()
    assert _rows(run_dir) == _rows(straight)
    assert _weights(run_dir) == _weights(straight)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The uninterrupted 2-rank run."""
    root = tmp_path_factory.mktemp("rollout_ranks")
    run_dir, log = root / "straight", root / "straight.log"
    assert _finish(_launch(run_dir, log), log) == 0, log.read_text()[-4000:]
    text = log.read_text()
    assert "rollout ranks: 1 of 2 (the last), draws one step ahead" in text
    assert "rollout rank 1: drew 3 steps for training ranks 0" in text
    return run_dir


def one_process_run(tmp_path: Path, gpu=False) -> Path:
    """The same run (COMMON) in one process, no rollout ranks; `gpu`: CUDA visible."""
    local, log = tmp_path / "local", tmp_path / "local.log"
    env = _env()
    env.pop("PAUSE_AT_RANK")
    if gpu:
        env.pop("CUDA_VISIBLE_DEVICES")
    cmd = [sys.executable, str(PAUSE_AT), "none", "0", str(tmp_path / "none"), *COMMON]
    with open(log, "w") as out:
        done = subprocess.run([*cmd, f"run_dir={local}"], cwd=ROOT, env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=HANG_GUARD_S)  # fmt: skip
    assert done.returncode == 0, log.read_text()[-4000:]
    return local


@pytest.mark.slow
def test_rollout_rank_run_equals_the_one_process_run(straight, tmp_path):
    local = one_process_run(tmp_path)
    remote = _rows(straight)
    assert [remote[s]["async/staleness"] for s in (1, 2, 3)] == [0.0, 1.0, 1.0]
    for row in remote.values():
        assert row.pop("sync/push_bytes") > 0  # theta in the engine's dtype, every update
    assert remote == _rows(local)
    assert _weights(straight) == _weights(local)


@pytest.mark.slow
def test_the_plan_gives_the_training_rank_the_hosts_ram_a_rollout_rank_takes_no_share(straight):
    (plan,) = [x for x in (straight.parent / "straight.log").read_text().splitlines()
               if "memory: peak " in x]  # fmt: skip
    assert f"usable (memory.device_gib {HOST_GIB:.1f} GiB, 10% kept free)" in plan, plan


@pytest.mark.slow
def test_lost_rollout_rank_stops_the_trainer_and_the_run_resumes_exactly(straight, tmp_path):
    run_dir, log = tmp_path / "lost", tmp_path / "lost.log"
    proc = _launch(run_dir, log, "draw", 3, rank=1)  # step 3's draw, during step 2's update
    marker = log.with_suffix(".paused")
    _wait_for(marker, proc, log)
    os.kill(json.loads(marker.read_text())["pid"], signal.SIGKILL)
    assert _finish(proc, log) == 4, log.read_text()[-4000:]
    lines = log.read_text().rstrip().splitlines()
    said = "sparrow-train: rank 0 of 2 stops: another rank was lost"
    assert lines[-2] == "launch_multinode.sh: rank 0 exited with 4, rank 1 was killed by SIGKILL; "\
        "rank 0 said:"  # fmt: skip
    assert lines[-1].startswith(said) and "resume=auto continues from" in lines[-1]
    assert sorted(_rows(run_dir)) == [1]
    _resumes_to(straight, run_dir, log)


@pytest.mark.slow
def test_kill_with_a_rollout_in_flight_resumes_exactly(straight, tmp_path):
    run_dir, log = tmp_path / "overlap", tmp_path / "overlap.log"
    proc = _launch(run_dir, log, "overlap", 2, rank=0)
    _wait_for(log.with_suffix(".paused"), proc, log)
    # The rollout rank is frozen mid-draw of step 3. The whole launch dies, as a lost node: the
    # workers (torchrun starts each in its own session) and the agent.
    for pid_file in (log.with_suffix(".paused"), log.with_suffix(".draw")):
        text = pid_file.read_text()
        os.kill(json.loads(text)["pid"] if text.startswith("{") else int(text), signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert sorted(_rows(run_dir)) == [1]
    _resumes_to(straight, run_dir, log)


@pytest.mark.slow
def test_lost_training_rank_stops_the_rollout_rank_and_the_run_resumes_exactly(straight, tmp_path):
    run_dir, log = tmp_path / "lost_trainer", tmp_path / "lost_trainer.log"
    proc = _launch(run_dir, log, "update", 2, rank=0)  # step 3's draw is asked for by then
    marker = log.with_suffix(".paused")
    _wait_for(marker, proc, log)
    os.kill(json.loads(marker.read_text())["pid"], signal.SIGKILL)
    assert _finish(proc, log) == 4, log.read_text()[-4000:]
    lines = log.read_text().rstrip().splitlines()
    assert lines[-2] == "launch_multinode.sh: rank 0 was killed by SIGKILL, rank 1 exited with "\
        "4; rank 1 said:"  # fmt: skip
    assert lines[-1].startswith("sparrow-train: rank 1 of 2 stops: another rank was lost")
    _resumes_to(straight, run_dir, log)
