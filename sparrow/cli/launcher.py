"""torchrun's agent in this process, ending a failed run with sparrow's own line and exit code.

    python -m sparrow.cli.launcher [torchrun options] ENTRY [args ...]   # launch_multinode.sh

torchrun ends a failed run with its agent's traceback and a failure table (exit 1), some 30
lines below the line in which a rank said why it stopped. Here the run ends instead with one line
naming each failed local rank's exit, then the stopping line of the lowest such rank that wrote
one (sparrow-train writes it into torchrun's per-worker error file: cli/errors.py `stop_line`),
and the launcher exits with that rank's code: 4 a rank was lost, 2 bad input, 3 non-finite
weights, 128 + signal after SIGTERM/SIGINT. A failure no rank explained (a crash, whose
traceback is above, or a worker killed from outside) exits 1. Everything else, signals included,
is torchrun's own behaviour: the same agent code runs, in the process the script exec'd.
"""

import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.run import parse_args, run

PROG = "launch_multinode.sh"
UNEXPLAINED_EXIT = 1  # torchrun's own code for a failed run


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except ChildFailedError as err:
        lines, exit_code = failure_lines(err.failures)
        print("\n".join(lines), file=sys.stderr, flush=True)
        return exit_code
    return 0


def failure_lines(failures: dict[int, ProcessFailure]) -> tuple[list[str], int]:
    """The lines a failed run ends with (a summary, then the explaining rank's own line) and the
    launcher's exit code, from torchrun's failures by global rank."""
    ranks = sorted(failures)
    summary = f"{PROG}: " + ", ".join(f"rank {r} {_how(failures[r])}" for r in ranks)
    explained = [(r, line) for r in ranks if (line := _stop_line(failures[r])) is not None]
    if not explained:
        return [f"{summary}; no rank said why (see the output above)"], UNEXPLAINED_EXIT
    rank, line = explained[0]
    code = failures[rank].exitcode
    return [f"{summary}; rank {rank} said:", line], code if code > 0 else 1


def _how(failure: ProcessFailure) -> str:
    if failure.exitcode < 0:
        return f"was killed by {failure.signal_name()}"
    return f"exited with {failure.exitcode}"


def _stop_line(failure: ProcessFailure) -> str | None:
    """The line the worker stopped with, when it wrote one (a plain string as the error file's
    message; torch's own @record writes a dict with a traceback)."""
    message = failure.error_file_data.get("message")
    if failure.error_file == "<N/A>" or not isinstance(message, str) or "\n" in message:
        return None
    return message


if __name__ == "__main__":
    sys.exit(main())
