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

The worker is a clean room, not a copy of the trainer: it sees only the environment variables
of `WORKER_ENV` (and `WORKER_ENV_PREFIXES`) plus the names the caller passes through, so W&B,
HF and cloud keys stay in the trainer; it runs in a temporary directory of its own, removed
when it ends; and what it prints goes to the trainer's stderr, never into its stdout.
"""

import ctypes
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# What a Python program needs to start, find its packages, speak the locale and stay on the
# trainer's devices and threads; nothing that could hold a secret.
WORKER_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH",
    "PYTHONHOME", "PYTHONHASHSEED", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
)  # fmt: skip
WORKER_ENV_PREFIXES = ("LC_",)
_SPARROW_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding sparrow/


class SandboxTimeout(TimeoutError):
    """The call ran past its deadline; the worker was killed and restarted."""


class SandboxError(RuntimeError):
    """The call raised in the worker, or the worker died; the message says which."""


def worker_env(passthrough: Sequence[str] = ()) -> dict[str, str]:
    """The worker's environment: this process's variables named by `WORKER_ENV`, starting with
    a `WORKER_ENV_PREFIXES` prefix, or in `passthrough`."""
    return {
        name: value
        for name, value in os.environ.items()
        if name in WORKER_ENV or name.startswith(WORKER_ENV_PREFIXES) or name in passthrough
    }


def worker_main(read_fd: int, write_fd: int, parent_pid: int) -> None:
    """The worker process's main loop, run by `python -c` in the child: take sys.path and
    `init`, say ready, then answer (fn, args) until EOF."""
    # Linux: the kernel kills this worker when the thread that started it exits (`_Spawner`'s,
    # which lives as long as the trainer), so a worker stuck in a runaway call does not outlive
    # a killed trainer. A trainer that died before this line is seen by the parent check.
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os._exit(1)
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
        except SystemExit as e:  # sys.exit() in the callee fails the call, not the worker
            replies.send(("error", f"SystemExit: the call ran sys.exit({e.code!r})"))


class _Spawner:
    """Starts every worker from one daemon thread that lives as long as this process.

    The parent-death signal fires when the *thread* that started the child exits: a worker
    restarted from the asynchronous loop's rollout thread (a new thread each step) would die at
    the end of that step, and one started there without the signal outlived a SIGKILLed trainer.
    This thread ends only with the process, so every worker can ask for the signal."""

    def __init__(self):
        self.pid = os.getpid()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        thread = threading.Thread(target=self._serve, name="sparrow-sandbox-spawner", daemon=True)
        thread.start()

    def _serve(self) -> None:
        while True:
            start, done = self._requests.get()
            try:
                done.put((True, start()))
            except BaseException as e:  # handed to the caller's thread
                done.put((False, e))

    def start(self, start: Callable[[], Any]) -> Any:
        """start() run in the spawner's thread; its result, or its exception raised here."""
        done: queue.SimpleQueue = queue.SimpleQueue()
        self._requests.put((start, done))
        ok, value = done.get()
        if not ok:
            raise value
        return value


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _the_spawner() -> _Spawner:
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner.pid != os.getpid():  # a forked child has no thread
            _spawner = _Spawner()
        return _spawner


class _Worker:
    """One started worker process, its two pipe ends and its temporary directory."""

    def __init__(self, init: Callable[[], object] | None, env: dict[str, str]):
        child_read, parent_write = os.pipe()
        parent_read, child_write = os.pipe()
        self.cwd = tempfile.mkdtemp(prefix="sparrow-worker-")
        # sparrow is found where this process found it, whatever the worker's directory.
        code = (
            f"import sys; sys.path.insert(0, {_SPARROW_ROOT!r}); "
            "from sparrow.tasks.sandbox import worker_main; "
            f"worker_main({child_read}, {child_write}, {os.getpid()})"
        )
        try:
            self.process = _the_spawner().start(
                lambda: subprocess.Popen(
                    [sys.executable, "-c", code],
                    pass_fds=(child_read, child_write),
                    stdin=subprocess.DEVNULL,
                    stdout=2,  # a print in the worker must not land in the trainer's stdout
                    cwd=self.cwd,
                    env=env,
                )
            )
        except BaseException:
            shutil.rmtree(self.cwd, ignore_errors=True)
            raise
        finally:
            os.close(child_read)
            os.close(child_write)
        self.replies = Connection(parent_read, writable=False)
        self.requests = Connection(parent_write, readable=False)
        # Relative entries ('' for `python -c`) would mean the worker's own directory there.
        self.requests.send([os.path.abspath(p) for p in sys.path])
        self.requests.send(init)
        self.ready = False

    def kill(self) -> None:
        self.requests.close()
        self.replies.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        shutil.rmtree(self.cwd, ignore_errors=True)


class Sandbox:
    """One worker process; `call` is thread-safe (calls are serialised)."""

    def __init__(
        self,
        init: Callable[[], object] | None = None,
        start_timeout_s: float = 120.0,
        env_passthrough: Sequence[str] = (),
    ):
        self.init = init  # picklable, run once in each fresh worker (imports, warm-up)
        self.start_timeout_s = start_timeout_s  # deadline for a fresh worker to become ready
        # Read once: each restart gets the same. Unbuffered: a print is seen when it is made,
        # not lost when the worker is killed.
        self.env = worker_env(env_passthrough) | {"PYTHONUNBUFFERED": "1"}
        self.num_restarts = 0  # workers replaced after a timeout or a death
        self._lock = threading.Lock()
        self._worker = _Worker(init, self.env)
        # Kill the worker when the sandbox is garbage-collected or the interpreter exits.
        self._finalizer = weakref.finalize(self, _Worker.kill, self._worker)

    def _restart(self) -> None:
        self._finalizer.detach()
        self._worker.kill()
        self.num_restarts += 1
        self._worker = _Worker(self.init, self.env)
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

    def call(
        self, fn: Callable[..., Any], *args: Any, timeout_s: float | None, name: str | None = None
    ) -> Any:
        """fn(*args) in the worker; raises SandboxTimeout after `timeout_s` seconds (None: no
        deadline). `name`: what the messages call it (default: fn's name)."""
        name = name or getattr(fn, "__name__", repr(fn))
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
