"""One JIT build of a DeepSpeed op at a time, and no start-up stuck behind a killed one.

torch builds a C++ extension under a plain lock file, `<build dir>/lock` (FileBaton): created when
a build starts, deleted when it ends, polled for while it exists. A process killed mid-build
(Ctrl-C, a preemption, torchrun ending a rank) leaves the file, and every later start-up then
polls forever, printing nothing. DeepSpeed's CPUAdam, the optimizer ZeRO-Offload steps on the
host (`actor.offload_optimizer=cpu`), is such an op, built on first use (minutes).

`op_build_guard` wraps the build in a kernel lock (fcntl.flock) beside torch's: the kernel drops
it when its holder dies, so whoever holds it knows that any torch lock file in the build
directory was left by a dead builder, and removes it with a one-line warning. Ranks of one host
that build at once wait for each other's build and say whom they wait for. A process that builds
the same op without this guard (not sparrow) is not seen.
"""

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torch.utils import cpp_extension

log = logging.getLogger(__name__)


def build_directory(op_name: str) -> Path:
    """Where torch builds `op_name`: `$TORCH_EXTENSIONS_DIR/<op>`, else its per-Python cache."""
    return Path(cpp_extension._get_build_directory(op_name, verbose=False))


@contextmanager
def op_build_guard(op_name: str) -> Iterator[None]:
    """Hold the build of `op_name` (DeepSpeed's JIT op, e.g. "cpu_adam") for the block."""
    build_dir = build_directory(op_name)
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(build_dir.parent / f"{op_name}.sparrow-build", "a+") as guard:
        try:
            fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            guard.seek(0)
            holder = guard.read().strip() or "another process"
            log.warning("waiting for process %s, which builds DeepSpeed's %s op", holder, op_name)
            fcntl.flock(guard, fcntl.LOCK_EX)
        guard.seek(0)
        guard.truncate()
        guard.write(str(os.getpid()))
        guard.flush()
        stale = build_dir / "lock"
        if stale.exists():  # no live builder holds it: every sparrow builder holds the guard
            log.warning("removed %s: a build of %s killed before it ended left it", stale, op_name)
            stale.unlink(missing_ok=True)
        try:
            yield
        finally:
            guard.seek(0)
            guard.truncate()
            fcntl.flock(guard, fcntl.LOCK_UN)
