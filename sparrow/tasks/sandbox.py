"""A killable worker process that runs one picklable call at a time under a deadline.

Why a process: math-verify's own timeout is `signal.alarm`, which only works on the main
thread, and a thread with a deadline cannot help either: a runaway SymPy evaluation such as
`9^{9^{9^{9}}}` spends its time in one C-level big-integer operation that holds the GIL, so the
waiting thread never even wakes up. A child process can be killed; it is restarted right away
so that the next call finds a warm worker.

The worker is a fresh interpreter (`python -c`), not a multiprocessing child: "fork" would
copy the trainer's CUDA contexts and thread locks in an undefined state, and "spawn" re-runs
the parent's `__main__` script, which fails (or starts a second trainer) when the script has no
`if __name__ == "__main__"` guard. Messages are pickled over two pipes; the worker gets the
parent's `sys.path`, so a callee must be importable by module and name. Worker start-up
(imports, `init`) is not charged to any call's deadline.
"""

import ctypes
import os
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class SandboxTimeout(TimeoutError):
    """The call ran past its deadline; the worker was killed and restarted."""


class SandboxError(RuntimeError):
    """The call raised in the worker, or the worker died; the message says which."""


def worker_main(read_fd: int, write_fd: int, die_with_parent: bool) -> None:
    """The worker process's main loop, run by `python -c` in the child: take sys.path and
    `init`, say ready, then answer (fn, args) until EOF."""
    if die_with_parent:
        # Linux: the kernel kills this worker when the thread that started it exits, so a
        # worker stuck in a runaway evaluation does not outlive a killed trainer. Only asked
        # for by the main thread: a worker started from a short-lived thread would die with it.
        try:
            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    requests, replies = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    sys.path[:] = requests.recv()
    init = requests.recv()
    if init is not None:
        init()
    replies.send(("ready", None))
    while True:
        try:
            fn, args = requests.recv()
        except EOFError:
            return
        except Exception as e:  # e.g. the callee is not importable here: report, keep serving
            replies.send(("error", f"cannot unpickle the call: {type(e).__name__}: {e}"))
            continue
        try:
            replies.send(("ok", fn(*args)))
        except Exception as e:  # the parent decides what a failure means
            replies.send(("error", f"{type(e).__name__}: {e}"))


class _Worker:
    """One started worker process and its two pipe ends."""

    def __init__(self, init: Callable[[], object] | None):
        child_read, parent_write = os.pipe()
        parent_read, child_write = os.pipe()
        die_with_parent = threading.current_thread() is threading.main_thread()
        code = (
            "from sparrow.tasks.sandbox import worker_main; "
            f"worker_main({child_read}, {child_write}, {die_with_parent})"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", code],
            pass_fds=(child_read, child_write),
            stdin=subprocess.DEVNULL,
        )
        os.close(child_read)
        os.close(child_write)
        self.replies = Connection(parent_read, writable=False)
        self.requests = Connection(parent_write, readable=False)
        self.requests.send(list(sys.path))
        self.requests.send(init)
        self.ready = False

    def kill(self) -> None:
        self.requests.close()
        self.replies.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


class Sandbox:
    """One worker process; `call` is thread-safe (calls are serialised)."""

    def __init__(self, init: Callable[[], object] | None = None, start_timeout_s: float = 120.0):
        self.init = init  # picklable, run once in each fresh worker (imports, warm-up)
        self.start_timeout_s = start_timeout_s  # deadline for a fresh worker to become ready
        self.num_restarts = 0  # workers replaced after a timeout or a death
        self._lock = threading.Lock()
        self._worker = _Worker(init)
        # Kill the worker when the sandbox is garbage-collected or the interpreter exits.
        self._finalizer = weakref.finalize(self, _Worker.kill, self._worker)

    def _restart(self) -> None:
        self._finalizer.detach()
        self._worker.kill()
        self.num_restarts += 1
        self._worker = _Worker(self.init)
        self._finalizer = weakref.finalize(self, _Worker.kill, self._worker)

    def _wait_ready(self) -> None:
        if self._worker.process.poll() is not None:
            # Died while idle (killed from outside): no request was lost, so just replace it.
            self._restart()
        if self._worker.ready:
            return
        if not self._worker.replies.poll(self.start_timeout_s):
            self._restart()
            raise SandboxError(f"worker did not start within {self.start_timeout_s} s")
        try:
            status, _ = self._worker.replies.recv()
        except EOFError:
            status = "died"
        if status != "ready":
            self._restart()
            raise SandboxError("worker died while starting (did its init raise? see stderr)")
        self._worker.ready = True

    def call(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None) -> Any:
        """fn(*args) in the worker; raises SandboxTimeout after `timeout_s` seconds (None: no
        deadline)."""
        name = getattr(fn, "__name__", repr(fn))
        with self._lock:
            self._wait_ready()
            try:
                self._worker.requests.send((fn, args))
                if not self._worker.replies.poll(timeout_s):
                    self._restart()
                    raise SandboxTimeout(f"{name} took over {timeout_s} s")
                status, value = self._worker.replies.recv()
            except (EOFError, BrokenPipeError, ConnectionResetError) as e:
                self._restart()
                raise SandboxError(f"worker died during {name}") from e
        if status == "error":
            raise SandboxError(value)
        return value

    def close(self) -> None:
        self._finalizer()
