"""The loop with lossless speculative rollouts (rollout.speculative): the rows the update reads
carry the dense policy's log-probs, so the rollout correction's ratio is 1 up to engine/trainer
numerics, where the approximate sparse rollout at the same 3-page budget is not; the DistillSparse
adapter drafts; a merged adapter is refused."""

import pytest
from test_loop_fake_actor import _trainer

from sparrow.cli.config_loader import ConfigError, load_config
from sparrow.train.step_report import format_plan

SPECULATIVE = ("rollout.speculative.enabled=true", "rollout.speculative.draft_tokens=3")


def _ratios(trainer):
    """Each completion token's exp(old - rollout) of one step's update."""
    seen = []
    real = trainer.actor.train_step

    def recording(micro_batches, loss_fn, temperature, keep=None):
        out = real(micro_batches, loss_fn, temperature, keep=keep)
        for mb, part in zip(micro_batches, keep.parts, strict=True):
            mask = mb["completion_mask"]
            seen.extend((part[0] - mb["rollout_logprobs"])[mask].exp().tolist())
        return out

    trainer.actor.train_step = recording
    trainer.train_step()
    return seen


@pytest.mark.parametrize("distill", [(), ("distill=default",)], ids=["plain", "distill"])
def test_speculative_rows_carry_the_dense_policys_log_probs(tmp_path, distill):
    trainer = _trainer(tmp_path / "spec", *SPECULATIVE, *distill)
    ratios = _ratios(trainer)
    stats = trainer.engine.last_stats
    assert stats.spec_drafted > 0 and stats.spec_accepted < stats.spec_drafted
    assert max(abs(r - 1) for r in ratios) < 1e-4, max(abs(r - 1) for r in ratios)
    approximate = _ratios(_trainer(tmp_path / "sparse", *distill))
    assert max(abs(r - 1) for r in approximate) > 1e-2  # the sparse rows' policy is not dense


def test_a_merged_adapter_cannot_verify(tmp_path):
    with pytest.raises(ConfigError, match="distill.gate=true"):
        load_config(["preset=tiny", *SPECULATIVE, "distill=default", "distill.gate=false"])


def test_the_tail_controller_holds_its_budgets_under_speculative_rollouts(tmp_path):
    """The rows are the dense pass's: their acceptance (the noise floor, ~1) says nothing of the
    drafts' and would lower every bin step after step; under controller.objective=tail the
    budgets stay as set and the plan says so (throughput, the default, steers on the drafts':
    test_speculative_throughput.py)."""
    online = ("schedule.mode=online", "schedule.budgets_pages=[6]", "controller.patience=1")
    tail = ("controller.min_tokens=1", "controller.objective=tail")
    trainer = _trainer(tmp_path, *SPECULATIVE, *online, *tail)
    for _ in range(2):
        trainer.train_step()
    assert list(trainer.steering.controller.schedule.budgets_pages) == [6]  # would be [3, 3]
    assert "the controller holds its budgets" in format_plan(trainer.cfg, "data", 1)
