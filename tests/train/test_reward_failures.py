"""A reward that fails is said on the console: one warning line the first step it fails (the
reward's name, the step's count, the last error) and a count in every step line that has
failures. Without them a reward broken on every completion trained to the end at
`reward 0.000` with no word (the guard kept `last_error`, nothing printed it). The metrics rows
are unchanged: `reward/errors` and `reward/timeouts` were logged every step already.

Evaluations too (issue 61 item 7): a reward failing on every completion of the step-0 evaluation
or of `sparrow-eval` printed `accuracy 0.000` and nothing else. Their failures are counted
(`eval/reward_*`, present when any failed), in the eval line, and warned once."""

import json
from dataclasses import asdict, replace

import sparrow.cli.eval_policy as eval_policy
from sparrow.cli.config_loader import load_config
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


def _warnings(caplog, word: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and word in r.getMessage()
    ]


def test_evaluations_count_and_warn_their_reward_failures(capsys, caplog, tmp_path):
    if "test_always_fails" not in REWARDS:
        register_reward("test_always_fails", lambda cfg: _fails)
    argv = ["preset=tiny", "rl.steps=1", "rl.eval.every=1", "rl.eval.num_prompts=4"]
    assert main([*argv, "rl.reward.name=test_always_fails", f"run_dir={tmp_path}"]) == 0
    evals = [line for line in capsys.readouterr().out.splitlines() if line.startswith("eval ")]
    assert len(evals) == 2 and all(", reward_errors 4/4" in line for line in evals), evals
    assert _warnings(caplog, "evaluation") == [  # once, at the first evaluation that failed
        "reward 'test_always_fails' failed on 4 of 4 completions in the evaluation at step 0 "
        "(each scored 0, a wrong answer to accuracy); last error: test_always_fails: "
        "ZeroDivisionError: division by zero"
    ]
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0 and first["eval/accuracy"] == 0.0
    assert (first["eval/reward_calls"], first["eval/reward_errors"]) == (4.0, 4.0)


def test_sparrow_eval_counts_and_warns_its_reward_failures(tmp_path, capsys, caplog, monkeypatch):
    """The run's stored reward now raises (e.g. its service is down): the output says so."""
    (tmp_path / "broken.py").write_text("def score(p, c, r):\n    raise RuntimeError('down')\n")
    cfg = load_config(["preset=tiny"])
    tiny_model = cfg.model
    reward = replace(cfg.rl.reward, function=f"{tmp_path}/broken.py:score")
    cfg = replace(cfg, rl=replace(cfg.rl, reward=reward))
    (tmp_path / "run_config.json").write_text(json.dumps(asdict(cfg), default=str))
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "config.json").write_text("{}")  # loaded below as the tiny model
    real_load = eval_policy.load_model
    monkeypatch.setattr(eval_policy, "load_model", lambda model_cfg: real_load(tiny_model))
    assert eval_policy.main([str(tmp_path), "--limit", "3"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "reward_errors 3/3 (each scored 0)"
    assert _warnings(caplog, "evaluation") == [
        f"reward '{tmp_path}/broken.py:score' failed on 3 of 3 completions in this evaluation "
        f"(each scored 0, a wrong answer to accuracy); last error: {tmp_path}/broken.py:score: "
        "RuntimeError: down"
    ]


def test_failures_scored_on_rollout_ranks_are_warned_without_their_error(caplog):
    # With cluster.rollout_ranks the training ranks' guard scored nothing and has no error.
    reward = GuardedReward(_fails, "remote", timeout_s=None)
    RewardFailures(reward, Ranks(0, 1)).check(1, _metrics(16.0))
    assert _warnings(caplog, "remote") == [
        "reward 'remote' failed on 16 of 16 completions in step 1 (each scored 0); last error: "
        "not sent back by the rollout ranks that scored (the step line counts failures as "
        "reward_errors)"
    ]
