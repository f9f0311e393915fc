"""The error boundary of every console script: a user's mistake is one line and exit 2.

User and environment errors (a bad config value, a missing model, file or folder, a run dir that
cannot be written, a full disk, a run dir whose config or checkpoint does not match) print one
line on stderr that names the key, option or path and what to do, and the script exits with 2;
a bad command-line option is such a line too (`ArgumentParser`), not a usage dump. SIGTERM or
SIGINT outside the training loop prints one line and exits with 128 + signal
(sparrow/train/run/stop_outside_loop.py). Anything else is a bug in sparrow and keeps its traceback.
Under torchrun a stopping line is also the worker's error file, which the launcher
(sparrow/cli/launcher.py) prints last.

    sys.exit(run_main("sparrow-generate", lambda: _main(argv)))
"""

import argparse
import errno
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sparrow.train.run.stop_outside_loop import Interrupted, stop_at_once

USER_ERROR_EXIT = 2
_INTERRUPT_EXIT = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
# torch.save's C++ writer reports a full disk without an errno ("unexpected pos ...",
# "PytorchStreamWriter failed writing file ...: file write failed").
_TORCH_WRITE_FAILED = ("unexpected pos", "file write failed")


class UserError(ValueError):
    """A mistake the user can fix; str() is one line that names the key or path and the fix."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are the boundary's one line ("argument --budgets: ..."), exit 2."""

    def error(self, message: str):
        raise UserError(f"{message} (see {self.prog} --help)")


def at_least(low: int) -> Callable[[str], int]:
    """An argparse `type`: an integer >= `low` (argparse's error names the option)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def run_main(prog: str, body: Callable[[], int]) -> int:
    """Run a console script's body inside the boundary; returns the exit code."""
    with stop_at_once():
        try:
            return body()
        except Interrupted as stop:
            return stop_line(f"{prog}: {stop}", stop.exit_code)
        except KeyboardInterrupt:  # a body run off the main thread has no handler of ours
            return stop_line(f"{prog}: interrupted", _INTERRUPT_EXIT)
        except Exception as err:
            line = user_error_line(err)
            if line is None:
                raise
            return stop_line(f"{prog}: error: {line}", USER_ERROR_EXIT)


def stop_line(line: str, exit_code: int) -> int:
    """Print the line a script stops with on stderr and return `exit_code`. Under torchrun the
    line is also this worker's error file ($TORCHELASTIC_ERROR_FILE, the one-string form torch's
    ProcessFailure reads), so that the launcher can end a failed run with it."""
    print(line, file=sys.stderr, flush=True)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        try:
            record = {"message": line, "timestamp": int(time.time())}
            Path(error_file).write_text(json.dumps(record))
        except OSError:  # the line is on stderr; the launcher then ends with its own summary
            pass
    return exit_code


def model_not_found(err: OSError, option: str, name: str) -> None:
    """Raise the one line for a model that cannot be loaded (`option` names the key or flag);
    return when `err` carries an errno (a path the boundary names itself)."""
    if err.errno is None:  # transformers' way of saying: no such hub id or directory
        raise UserError(
            f"cannot load {option}={name!r} ({one_line(err)}): give a local model directory or "
            "a hub id present in the HF cache"
        ) from err


def user_error_line(err: BaseException) -> str | None:
    """The one-line message for a user or environment error, None for an internal one."""
    for cause in causes(err):
        if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
            where = cause.filename or "the run dir's disk"
            return f"no space left on the device of {where}: free space or choose another run_dir"
    if isinstance(err, UserError):
        return one_line(err)
    if isinstance(err, RuntimeError) and any(s in str(err) for s in _TORCH_WRITE_FAILED):
        return f"a write failed ({one_line(err)}): is the disk full? free space or move run_dir"
    if isinstance(err, (PermissionError, IsADirectoryError, NotADirectoryError)) or (
        isinstance(err, OSError) and err.errno in (errno.EROFS, errno.EACCES)
    ):
        path = err.filename or "a path"
        return f"cannot write or read {path} ({err.strerror}): choose a writable run_dir"
    if isinstance(err, FileNotFoundError):
        return f"{err.filename or 'a file'}: no such file or directory"
    return None


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def causes(err: BaseException | None):
    """`err`, then what caused it or was being handled when it was raised, and so on."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__
