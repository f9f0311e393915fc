"""A step whose advantages are all zero is not applied: AdamW would otherwise move the weights
on its momentum alone. The real trainer (preset=tiny, in process)."""

import json

import torch

from sparrow.cli.config_loader import load_config
from sparrow.tasks.reward_result import RewardResult
from sparrow.train.trainer import GRPOTrainer


def _trainer(run_dir, skip: bool) -> GRPOTrainer:
    overrides = ["preset=tiny", f"run_dir={run_dir}", "rl.steps=3", "rl.eval.every=0"]
    overrides += ["rl.save_every=0", f"rl.skip_no_signal={str(skip).lower()}"]
    return GRPOTrainer.from_config(load_config(overrides))


def _weights(trainer) -> dict:
    return {k: v.detach().clone() for k, v in trainer.actor.model.state_dict().items()}


def _reward_first_sample_only(trainer, signal_steps: set[int]):
    """Rewards with variance (1 for one sample per call, else 0) only at `signal_steps`."""
    calls: list[int] = []

    def fn(prompt, completion, reference):
        calls.append(trainer.step + 1)
        rewarded = trainer.step + 1 in signal_steps and calls.count(trainer.step + 1) == 1
        return RewardResult(score=1.0 if rewarded else 0.0)

    trainer.draw.reward.fn = fn


def test_a_no_signal_step_leaves_weights_and_optimizer_untouched(tmp_path):
    trainer = _trainer(tmp_path, skip=True)
    _reward_first_sample_only(trainer, signal_steps={1})
    start = _weights(trainer)
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["update/no_signal"] for r in rows] == [0.0, 1.0, 1.0]
    after = _weights(trainer)
    assert any(not torch.equal(start[k], after[k]) for k in start)  # step 1 did update
    optimizer = trainer.actor.engine.optimizer
    assert all(s["step"] == 1 for s in optimizer.state.values())  # one Adam step, not three


def test_without_the_skip_adam_keeps_moving_on_momentum(tmp_path):
    moved = []
    for skip in (True, False):
        trainer = _trainer(tmp_path / str(skip), skip=skip)
        _reward_first_sample_only(trainer, signal_steps={1})
        synced = []  # the weights the engine receives after each step
        real_update = trainer.engine.update_weights

        def update_weights(state_dict, real_update=real_update, synced=synced):
            synced.append({k: v.detach().clone() for k, v in state_dict.items()})
            real_update(state_dict)

        trainer.engine.update_weights = update_weights
        trainer.fit()
        after_one, after_three = synced[0], synced[-1]
        moved.append(any(not torch.equal(after_one[k], after_three[k]) for k in after_one))
    assert moved == [False, True]  # zero gradients at steps 2-3, yet AdamW moved the weights
