"""One run per run dir (sparrow/train/run/lock.py): a second launch beside a live one exits 2 with
one line naming the holder; a lock file left by a SIGKILLed holder blocks nothing; a filesystem
without locks is said in one line. Slow: two real `sparrow-train` launches at once on one run
dir, of which exactly one trains."""

import errno
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.cli.train import main
from sparrow.train.run.lock import FILE_NAME, RunDirBusy, RunDirLock

REPO = Path(__file__).resolve().parents[3]
_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
HOLD = textwrap.dedent(
    """
    import sys, time
    from sparrow.train.run.lock import RunDirLock
    RunDirLock(sys.argv[1]).acquire()
    print("held", flush=True)
    time.sleep(600)
    """
)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    return env | {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true"}


def _holder(run_dir: Path) -> subprocess.Popen:
    """A process that takes the run dir's lock and sleeps; returns once it holds it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)], env=_env(), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_lock_on_a_live_run_dir_is_refused_naming_the_holder(tmp_path):
    first = RunDirLock(tmp_path)
    assert first.acquire()
    holder = json.loads((tmp_path / FILE_NAME).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    with pytest.raises(RunDirBusy) as refused:  # another open file: flock refuses it too
        RunDirLock(tmp_path).acquire()
    assert f"pid {os.getpid()} on {socket.gethostname()} since {holder['started']}" in str(
        refused.value
    )
    first.release()
    with RunDirLock(tmp_path):  # released: free again
        pass


def test_a_live_holder_blocks_and_a_killed_one_does_not(tmp_path):
    proc = _holder(tmp_path)
    try:
        with pytest.raises(RunDirBusy, match=f"pid {proc.pid} on "):
            RunDirLock(tmp_path).acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert json.loads((tmp_path / FILE_NAME).read_text())["pid"] == proc.pid  # the file stays
    lock = RunDirLock(tmp_path)
    assert lock.acquire()  # the kernel dropped the dead holder's lock
    assert json.loads((tmp_path / FILE_NAME).read_text())["pid"] == os.getpid()
    lock.release()


def test_the_cli_refuses_a_held_run_dir_with_exit_2_and_one_line(tmp_path, capsys):
    proc = _holder(tmp_path)
    try:
        assert main(["preset=tiny", f"run_dir={tmp_path}"]) == 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sparrow-train: error: run_dir "), err
    assert f"in use by pid {proc.pid} on {socket.gethostname()}" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]  # nothing else written


def test_a_filesystem_without_locks_is_said_once_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with caplog.at_level(logging.WARNING, logger="sparrow.train.run.lock"):
        assert RunDirLock(tmp_path).acquire() is False
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "has no file locks" in lines[0] and str(tmp_path) in lines[0]


@pytest.mark.slow
def test_two_launches_at_once_exactly_one_trains(tmp_path):
    """Two real `sparrow-train preset=tiny` processes started together on one run dir."""
    cmd = [sys.executable, "-m", "sparrow.cli.train", "preset=tiny", "rl.steps=3"]
    cmd += ["rl.eval.every=0", f"run_dir={tmp_path}"]
    start = time.monotonic()
    procs = [
        subprocess.Popen(cmd, cwd=REPO, env=_env(), stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(p.pid, p.wait(timeout=HANG_GUARD_S), p.stderr.read()) for p in procs]
    print(f"two launches: {time.monotonic() - start:.0f} s")
    assert sorted(rc for _, rc, _ in results) == [0, 2], results
    (winner, _, _), (_, _, refusal) = sorted(results, key=lambda r: r[1])
    lines = [line for line in refusal.splitlines() if line.startswith("sparrow-train:")]
    assert len(lines) == 1 and "Traceback" not in refusal, refusal
    assert f"in use by pid {winner} on {socket.gethostname()}" in lines[0]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
