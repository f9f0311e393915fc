"""A reward that fails is said on the console: one warning line the first step it fails (the
reward's name, the step's count, the last error) and a count in every step line that has
failures. Without them a reward broken on every completion trained to the end at
`reward 0.000` with no word (the guard kept `last_error`, nothing printed it). The metrics rows
are unchanged: `reward/errors` and `reward/timeouts` were logged every step already."""

from sparrow.cli.train import main
from sparrow.distributed import Ranks
from sparrow.tasks.rewards import REWARDS, GuardedReward, register_reward, score_batch
from sparrow.train.step_report import RewardFailures, format_step_line


def _fails(prompt, completion, reference):
    return 1 / 0


def _metrics(errors: float, timeouts: float = 0.0, calls: float = 16.0) -> dict:
    return {"reward/errors": errors, "reward/timeouts": timeouts, "reward/calls": calls}


def test_step_line_counts_failures_only_when_there_are_some():
    line = format_step_line(3, 10, {"reward/mean": 0.0} | _metrics(12.0, 4.0))
    assert "| reward 0.000 acc nan len nan reward_errors 16/16 |" in line, line
    assert "reward_errors" not in format_step_line(3, 10, _metrics(0.0))


def test_the_first_failing_step_warns_once(caplog):
    reward = GuardedReward(_fails, "broken", timeout_s=None)
    failures = RewardFailures(reward, Ranks(0, 1))
    failures.check(1, _metrics(0.0))  # a clean step says nothing
    caplog.clear()
    for step in (2, 3):
        stats = score_batch(reward, ["p"] * 4, ["c"] * 4, ["r"] * 4).stats
        failures.check(step, _metrics(stats.errors, stats.timeouts, stats.calls))
    assert [r.getMessage() for r in caplog.records] == [
        "reward 'broken' failed on 4 of 4 completions in step 2 (each scored 0); last error: "
        "broken: ZeroDivisionError: division by zero (the step line counts failures as "
        "reward_errors)"
    ]


def test_a_reward_failing_on_every_completion_is_said_on_the_console(capsys, caplog, tmp_path):
    if "test_always_fails" not in REWARDS:
        register_reward("test_always_fails", lambda cfg: _fails)
    argv = ["preset=tiny", "rl.steps=1", "rl.eval.every=0", "rl.reward.name=test_always_fails"]
    assert main([*argv, f"run_dir={tmp_path}"]) == 0  # the run goes on: each completion scores 0
    out = capsys.readouterr().out
    records = [(r.levelname, r.getMessage()) for r in caplog.records]
    warnings = [(level, text) for level, text in records if "test_always" in text]
    assert warnings == [
        (
            "WARNING",
            "reward 'test_always_fails' failed on 16 of 16 completions in step 1 (each scored "
            "0); last error: test_always_fails: ZeroDivisionError: division by zero (the step "
            "line counts failures as reward_errors)",
        )
    ]
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 1 and "reward 0.000 acc 0.000 " in steps[0], out
    assert " reward_errors 16/16 " in steps[0], out
