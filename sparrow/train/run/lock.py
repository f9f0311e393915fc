"""One live run per run dir: an exclusive `flock` on `RUN_DIR/run.lock`, held while the run lives.

    with RunDirLock(cfg.run_dir):   # raises RunDirBusy naming the holder (host, pid, start time)
        GRPOTrainer.from_config(cfg).fit()

The kernel drops a flock when the open file it was taken on is closed, which happens however the
holder ends (SIGKILL and the OOM killer included): a lock file left behind by a dead process never
blocks the next launch (a SLURM requeue), while a launch beside a live one is refused. The file
stays (removing it would let a third launch lock a new file while the second still holds the old
one); its content is the holder's host, pid and start time, rewritten by each holder, for the
refusal's message. The caller takes it before anything is written to the run dir; in a
multi-rank run rank 0 alone does, and the other ranks write only after collectives that wait for
rank 0 (checkpoint saves), so they cannot run ahead of a refused rank 0. Where the filesystem has
no working flock (some NFS and Lustre mounts: ENOLCK, EOPNOTSUPP, ENOSYS), the run says so in one
line and goes on unlocked.
"""

import errno
import fcntl
import json
import logging
import os
import socket
import time
from datetime import datetime
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "run.lock"
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)
_HOLDER_WAIT_S = 2.0  # a holder that has just taken the lock may not have written itself yet


class RunDirBusy(ValueError):
    """Another live process holds the run dir; str() names it and what to do."""


class RunDirLock:
    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / FILE_NAME
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock and write this process into the file; False (after one warning line)
        where the filesystem has no locks. Raises RunDirBusy while another process holds it."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not truncated: the holder's
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirBusy(
                f"run_dir {self.run_dir} is in use by {self._holder()}: wait for that run to end "
                "or stop it, or choose another run_dir"
            ) from None
        except OSError as err:
            os.close(fd)
            if err.errno not in _NO_LOCKS:
                raise
            log.warning(
                "the filesystem of %s has no file locks (%s): nothing stops a second launch on "
                "this run dir",
                self.run_dir,
                err.strerror,
            )
            return False
        holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": datetime.now().astimezone().isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the file drops the lock
            self._fd = None

    def __enter__(self) -> "RunDirLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _holder(self) -> str:
        """'pid P on HOST since TIME' from the lock file, as the holder wrote it."""
        deadline = time.monotonic() + _HOLDER_WAIT_S
        while True:
            try:
                holder = json.loads(self.path.read_text())
                return f"pid {holder['pid']} on {holder['host']} since {holder['started']}"
            except (OSError, ValueError, KeyError, TypeError):
                if time.monotonic() > deadline:
                    return "another process (it has not written its pid into the lock file)"
                time.sleep(0.05)
