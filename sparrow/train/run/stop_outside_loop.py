"""SIGTERM / SIGINT outside the step loop: stop at once, with one line and exit 128 + signal.

Inside the step loop `GracefulStop` defers a signal to the end of the step, which is finished and
checkpointed. Everywhere else there is nothing to finish: start-up (model, data, DeepSpeed, the
resume, the step-0 evaluation), the final policy export, and the other console scripts. There,
`stop_at_once` installs handlers that raise `Interrupted` where the main thread is; `finally`
blocks and `with` exits run on the way out (a temporary export is removed, the run-dir lock is
released with the process), and the console script's boundary prints
`prog: stopped by SIGTERM during <phase>; <advice>` and exits with 128 + signal.

`Interrupted` derives from BaseException, as KeyboardInterrupt does, so that library code's
`except Exception` cannot swallow it. A signal that arrives while one is already being handled
(a launcher's copy of the same request, or a second Ctrl-C) is ignored, so that the clean-up
itself is not interrupted. No torch here: every console script imports this module.

    with stop_at_once("the policy export", "run the same command again to write policy/"):
        export()
"""

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# What sparrow-train says when stopped before its first step (model, data, DeepSpeed, resume,
# step-0 evaluation): nothing of the launch needs keeping.
STARTUP_ADVICE = "no step was in flight; run the same command again to start (resume=auto)"


class Interrupted(BaseException):
    """A stop signal outside the step loop; str() is the one line for the user."""

    def __init__(self, signum: int, during: str | None = None, advice: str | None = None):
        self.signum = signum
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        text = f"stopped by {name}" + (f" during {during}" if during else "")
        super().__init__(text + (f"; {advice}" if advice else ""))


@contextmanager
def stop_at_once(during: str | None = None, advice: str | None = None) -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise `Interrupted(signum, during, advice)` in the
    main thread (elsewhere the block runs unguarded: handlers are the main thread's)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handle(signum: int, frame) -> None:
        if fired:  # already stopping: let the clean-up finish
            return
        fired.append(signum)
        raise Interrupted(signum, during, advice)

    handle.stops_at_once = True  # type: ignore[attr-defined]  # a mark, read back by getattr
    previous = {sig: signal.signal(sig, handle) for sig in SIGNALS}
    stopping = False
    try:
        yield
    except Interrupted:
        stopping = True
        raise
    finally:
        for sig, handler in previous.items():
            if signal.getsignal(sig) is signal.SIG_IGN:
                continue  # ignore_stop_signals: on the way out, and staying so
            if stopping and getattr(handler, "stops_at_once", False):
                # An enclosing block (the console script's boundary) prints the line: until it
                # has, a repeated signal must not interrupt the clean-up on the way there.
                handler = _ignore
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def ignore_stop_signals() -> None:
    """From here on the process ignores SIGTERM and SIGINT (main thread only; `stop_at_once`
    leaves them ignored): it is on its way out with a line and an exit code of its own, which a
    launcher's SIGTERM must not replace (torchrun signals the other ranks as soon as one dies)."""
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def _ignore(signum: int, frame) -> None:
    pass
