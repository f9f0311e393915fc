"""One stop request delivered twice is one request: under torchrun the workers get SIGTERM from
SLURM (every process of the job step) or the terminal (Ctrl-C, the whole foreground group) and
again from torchrun, which forwards its own copy. Before, the copy counted as the "second
signal" and exited at once, without the checkpoint the first one asked for. A signal after
DUPLICATE_WINDOW_S still exits at once."""

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from hang_guard import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent(
    """
    import os, signal, time
    from sparrow.train.run.stop_in_loop import DUPLICATE_WINDOW_S, GracefulStop

    with GracefulStop() as stop:
        os.kill(os.getpid(), signal.SIGTERM)  # SLURM's
        os.kill(os.getpid(), signal.SIGTERM)  # torchrun's copy, milliseconds later
        assert stop.signum == signal.SIGTERM
        print("still running", flush=True)
        time.sleep(DUPLICATE_WINDOW_S + 0.5)
        os.kill(os.getpid(), signal.SIGTERM)  # a real second request
        time.sleep(10)
    print("not reached", flush=True)
    """
)


def test_copy_of_the_first_signal_is_not_a_second_request():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert "still running" in proc.stdout, proc.stderr[-2000:]
    assert "not reached" not in proc.stdout
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    assert proc.stderr.count("SIGTERM received") == 1
    assert "SIGTERM again: exiting now" in proc.stderr
