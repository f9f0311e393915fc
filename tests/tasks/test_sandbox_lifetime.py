"""A reward worker never outlives the process that started it (issue 61 item 4).

Linux's parent-death signal fires when the *thread* that started a child exits, not its process.
Under `rl.async.staleness=1` a worker killed at a deadline is restarted from the rollout thread
(one thread per step): a worker started there without the signal spun on at ~94% CPU after its
trainer was SIGKILLed, and one started there with it would die when the step's thread ends. A
stand-in trainer does what the trainer does (a worker started in the main thread, or replaced
from a thread that then exits), sets the worker spinning, and is SIGKILLed: the worker must be
gone, and it must have served a call after its starting thread was gone."""

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang_guard import CHILD_GUARD_S, HANG_GUARD_S

_SPINNER = """
def spin():
    while True:
        pass
"""

_STAND_IN = """
import operator, sys, threading, time
from spinner import spin
from sparrow.tasks.sandbox import Sandbox, SandboxTimeout

GUARD = float(sys.argv[2])  # a hang guard: these calls return at once
sandbox = Sandbox()
assert sandbox.call(operator.add, 1, 2, timeout_s=GUARD) == 3


def overrun():  # the rollout thread: a call past its deadline, its worker replaced from here
    try:
        sandbox.call(time.sleep, 600, timeout_s=0.2)
    except SandboxTimeout:
        pass
    assert sandbox.call(operator.add, 2, 1, timeout_s=GUARD) == 3  # the step scores on


if sys.argv[1] == "thread":
    worker = threading.Thread(target=overrun)
    worker.start()
    worker.join()  # the thread that started the replacement has exited
    assert sandbox.call(operator.add, 2, 2, timeout_s=GUARD) == 4
    assert sandbox.num_restarts == 1, sandbox.num_restarts  # the replacement served: not killed
threading.Thread(target=sandbox.call, args=(spin,), kwargs={"timeout_s": None}).start()
print(sandbox._worker.process.pid, flush=True)
time.sleep(GUARD)
"""


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (a dead worker no reaper has collected yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("started_in", ["main", "thread"])
def test_the_worker_dies_with_a_sigkilled_trainer(tmp_path, started_in):
    (tmp_path / "spinner.py").write_text(_SPINNER)
    (tmp_path / "stand_in.py").write_text(_STAND_IN)
    trainer = subprocess.Popen(
        [sys.executable, str(tmp_path / "stand_in.py"), started_in, str(CHILD_GUARD_S)],
        stdout=subprocess.PIPE,
        text=True,
    )
    worker_pid = None
    try:
        select.select([trainer.stdout], [], [], HANG_GUARD_S)
        line = trainer.stdout.readline()
        assert line.strip().isdigit(), f"the stand-in failed: exit {trainer.wait()}"
        worker_pid = int(line)
        assert _running(worker_pid)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
        deadline = time.monotonic() + HANG_GUARD_S
        while _running(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _running(worker_pid), f"worker {worker_pid} outlived its trainer"
    finally:
        trainer.kill()
        trainer.wait()
        if worker_pid is not None and _running(worker_pid):
            os.kill(worker_pid, signal.SIGKILL)  # never leave a spinning worker behind
