"""Graceful stop on SIGTERM / SIGINT: finish the step in flight, checkpoint it, then exit.

SLURM and Kubernetes send SIGTERM some time before they kill a job; Ctrl-C sends SIGINT. The
first signal only sets a flag; the training loop reads it between steps (`requested`, the same
answer on every rank), saves a checkpoint of the step it just finished, closes the logger and
raises `StopRequested`, which the CLI turns into one line and exit code 128 + signal. A second
signal exits at once (a checkpoint write in flight is left as a `.tmp` directory, which the next
launch removes), unless it comes within `DUPLICATE_WINDOW_S` of the first: under torchrun one
request arrives twice, as SLURM signals every process of the job step (a terminal's Ctrl-C,
the whole foreground group) and torchrun forwards its own copy to the workers.
"""

import os
import signal
import sys
import threading
import time
from typing import Any

import torch

from sparrow.distributed import all_reduce_host

SIGNALS = (signal.SIGTERM, signal.SIGINT)
DUPLICATE_WINDOW_S = 1.0  # a repeat this soon after the first signal is the same request


class StopRequested(Exception):
    """Raised by the loop after a signal; str() is the line telling where to resume."""

    def __init__(self, signum: int, step: int, checkpoint):
        self.exit_code = 128 + signum
        super().__init__(
            f"stopped by {signal.Signals(signum).name} after step {step}; checkpoint "
            f"{checkpoint}; run the same command again (resume=auto) to continue"
        )


class GracefulStop:
    """Signal handlers installed for the duration of a `with` block (main thread only)."""

    def __init__(self):
        self.signum: int | None = None
        self._first_at = 0.0  # time.monotonic() of the first signal
        self._previous: dict[int, Any] = {}  # what signal.signal returned: a handler or flag

    def __enter__(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def requested(self, world_size: int) -> bool:
        """Whether any rank got a signal (collective when world_size > 1: all ranks call)."""
        flag = torch.tensor([float(self.signum is not None)], dtype=torch.float64)
        if world_size > 1:
            flag = all_reduce_host(flag)
        return bool(flag.item() > 0)

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            if time.monotonic() - self._first_at < DUPLICATE_WINDOW_S:
                return  # the launcher's copy of the first request
            print(f"{name} again: exiting now, without a checkpoint", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.signum = signum
        self._first_at = time.monotonic()
        print(
            f"{name} received: finishing the step in flight and saving a checkpoint "
            f"(send it again to exit at once)",
            file=sys.stderr,
            flush=True,
        )
