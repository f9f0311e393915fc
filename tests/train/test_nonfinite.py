"""NaN/Inf in the update: the step is skipped (weights, optimizer and LR untouched) and logged;
a streak of them stops the run with a clear message, and sparrow-train says it in one line.

The real GRPO trainer (preset=tiny, in process) with two kinds of fault: a NaN loss (the policy
loss poisoned) and an Inf gradient under a finite loss (a gradient hook on one weight).
The actor-level skip for every ZeRO stage is in tests/rl/test_actor.py.
"""

import json
import logging
import math

import pytest
import torch

from sparrow.cli import train as train_cli
from sparrow.cli.config_loader import load_config
from sparrow.train import trainer as trainer_module
from sparrow.train.run.weight_guard import NonFiniteStreak
from sparrow.train.trainer import GRPOTrainer


def _trainer(run_dir, steps: int, streak: int = 3) -> GRPOTrainer:
    cfg = load_config(
        [
            "preset=tiny",
            f"run_dir={run_dir}",
            f"rl.steps={steps}",
            f"rl.max_nonfinite_streak={streak}",
            "rl.eval.every=0",
            "rl.save_every=0",
        ]
    )
    return GRPOTrainer.from_config(cfg)


def _poison(trainer: GRPOTrainer, nan_loss_steps: set[int], inf_grad_steps: set[int]) -> list:
    """Fault the given steps; returns the weights the engine receives after each step."""
    real_loss = trainer.policy_update.loss_fn

    def loss_fn(*args, **kwargs):
        loss, metrics = real_loss(*args, **kwargs)
        return (loss * math.nan if trainer.step + 1 in nan_loss_steps else loss), metrics

    def grad_hook(grad):
        return torch.full_like(grad, math.inf) if trainer.step + 1 in inf_grad_steps else grad

    trainer.policy_update.loss_fn = loss_fn
    next(trainer.actor.model.parameters()).register_hook(grad_hook)
    synced = []
    real_update = trainer.engine.update_weights

    def update_weights(state_dict):
        synced.append({k: v.detach().clone() for k, v in state_dict.items()})
        real_update(state_dict)

    trainer.engine.update_weights = update_weights
    return synced


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_nonfinite_updates_are_skipped_logged_and_the_streak_resets(tmp_path, caplog):
    trainer = _trainer(tmp_path, steps=6, streak=3)
    synced = _poison(trainer, nan_loss_steps={2, 5}, inf_grad_steps={3, 6})
    with caplog.at_level(logging.WARNING, logger="sparrow.train.trainer"):
        trainer.fit()  # 2 faulty steps, a good one, 2 faulty: never 3 in a row

    rows = _rows(tmp_path)
    assert [r["update/skipped"] for r in rows] == [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    assert not math.isfinite(float(rows[1]["loss/loss"]))  # NaN loss, logged as such
    assert math.isfinite(rows[2]["loss/loss"])  # finite loss, Inf gradient
    assert not math.isfinite(float(rows[2]["update/grad_norm"]))
    for step in (2, 3, 5, 6):
        assert f"step {step}: non-finite loss or gradient, update skipped" in caplog.text
    # A skipped step changes nothing: the weights synced after it equal the ones before it,
    # and the LR schedule does not advance; good steps do train.
    assert _same(synced[1], synced[0]) and _same(synced[2], synced[0])
    assert not _same(synced[3], synced[2])
    assert _same(synced[5], synced[3])
    assert rows[1]["update/lr"] == rows[2]["update/lr"] == rows[0]["update/lr"]
    assert trainer.run.nonfinite_streak == 2


def test_a_streak_stops_the_run_with_a_clear_message(tmp_path):
    trainer = _trainer(tmp_path, steps=8, streak=3)
    synced = _poison(trainer, nan_loss_steps={2, 4}, inf_grad_steps={3})
    with pytest.raises(NonFiniteStreak) as err:
        trainer.fit()
    message = str(err.value)
    assert "3 consecutive updates had a non-finite loss or gradient" in message
    assert "last at step 4" in message and "resume=auto" in message
    assert [r["step"] for r in _rows(tmp_path)] == [1, 2, 3]  # stopped in step 4
    assert _same(synced[-1], synced[0])  # nothing of the faulty steps reached the weights


def test_cli_reports_the_streak_in_one_line(monkeypatch, capsys):
    class StreakingTrainer:
        @classmethod
        def from_config(cls, cfg, pinned=None, roles=None):
            return cls()

        def fit(self):
            raise NonFiniteStreak("3 consecutive updates had a non-finite loss\nor gradient")

    monkeypatch.setattr(trainer_module, "GRPOTrainer", StreakingTrainer)
    assert train_cli.main(["preset=tiny"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "sparrow-train: stopped: 3 consecutive updates had a non-finite loss or gradient"
    ]
