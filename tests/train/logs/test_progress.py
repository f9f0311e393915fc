"""The step line's progress: share done, elapsed time and an ETA from this launch's steps."""

from sparrow.train.logs import progress
from sparrow.train.logs.progress import StepClock, format_duration


def test_eta_is_the_mean_step_time_times_the_steps_left(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    clock = StepClock(first_step=4, total_steps=10)  # a launch resumed at step 4
    assert clock.line(4) == "40% | 0s elapsed, eta ?"
    now[0] += 90.0  # two steps in 90 s
    assert clock.line(6) == "60% | 1m30s elapsed, eta 3m00s"
    now[0] += 4 * 3600
    assert clock.line(10) == "100% | 4h01m elapsed, eta 0s"
    assert format_duration(59.6) == "1m00s"
