"""SIGTERM / SIGINT outside the step loop stop at once (`stop_at_once`): `Interrupted` is raised
where the main thread is, the handlers come back afterwards, a repeated signal does not cut the
clean-up short, and every console script's boundary prints one line and returns 128 + signal.
Real signals to this process; the real sparrow-train is signalled in test_stop_signals.py."""

import os
import signal
import time

import pytest

from sparrow.cli.errors import run_main
from sparrow.train.run.stop_outside_loop import Interrupted, ignore_stop_signals, stop_at_once


def test_stop_at_once_raises_where_the_main_thread_is_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as caught, stop_at_once("start-up", "run it again"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # interrupted: the handler raises in the main thread
    assert caught.value.exit_code == 128 + signal.SIGTERM
    assert str(caught.value) == "stopped by SIGTERM during start-up; run it again"
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_repeated_signal_does_not_interrupt_the_clean_up():
    cleaned = []
    with pytest.raises(Interrupted) as caught, stop_at_once("the policy export"):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # a launcher's copy, during the clean-up
            time.sleep(0.2)
            cleaned.append(True)
    assert cleaned == [True] and caught.value.signum == signal.SIGINT


def test_run_main_turns_a_signal_into_one_line_and_128_plus_signal(capsys):
    def body() -> int:
        with stop_at_once("start-up", "no step was in flight"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        return 0

    assert run_main("sparrow-x", body) == 143
    err = capsys.readouterr().err
    assert err == "sparrow-x: stopped by SIGTERM during start-up; no step was in flight\n"

    def tool() -> int:  # any console script, outside any phase of its own
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        return 0

    assert run_main("sparrow-y", tool) == 130
    assert capsys.readouterr().err == "sparrow-y: stopped by SIGINT\n"


def test_ignored_signals_stay_ignored_on_the_way_out():
    before = signal.getsignal(signal.SIGTERM)
    try:
        with stop_at_once():
            ignore_stop_signals()
            os.kill(os.getpid(), signal.SIGTERM)  # would raise (or kill) without the ignore
            time.sleep(0.2)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)
