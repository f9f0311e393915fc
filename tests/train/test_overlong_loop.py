"""rl.overlong through the loop (FakeActor, tiny model): the penalty shapes the advantages, the
task's scores stay the logged reward, and filtering leaves the truncated rows out of the loss."""

import json

import pytest
import torch
from test_loop_fake_actor import _trainer


def test_penalty_and_filtering_reach_the_update(tmp_path):
    # 8 new tokens at most, a 4-token buffer: a completion of n > 4 tokens loses (n - 4) / 4.
    trainer = _trainer(
        tmp_path, "rl.steps=1", "rl.overlong.buffer=4", "rl.overlong.mask_truncated=true"
    )
    seen = {}
    real_advantages, real_train_step = trainer.advantage_fn, trainer.actor.train_step

    def advantages(rewards, group_ids):
        seen["rewards"] = rewards.clone()
        return real_advantages(rewards, group_ids)

    def train_step(micro_batches, loss_fn, temperature, keep=None):
        seen["micro_batches"] = micro_batches
        return real_train_step(micro_batches, loss_fn, temperature, keep=keep)

    real_overlong = trainer._overlong

    def overlong(scores, batch):
        # A random tiny model never stops on its own: every other row is made an EOS stop, so
        # that the step holds rows of both kinds.
        batch.finish_reasons[::2] = ["eos"] * len(batch.finish_reasons[::2])
        seen["scores"], seen["batch"] = scores.clone(), batch
        return real_overlong(scores, batch)

    trainer.advantage_fn, trainer.actor.train_step = advantages, train_step
    trainer._overlong = overlong
    trainer.fit()
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    batch = seen["batch"]
    lengths = batch.completion_mask.sum(-1).float()
    penalty = -((lengths - 4) / 4).clamp(min=0)
    torch.testing.assert_close(seen["rewards"], seen["scores"] + penalty)
    assert row["reward/mean"] == pytest.approx(float(seen["scores"].mean()))  # the task's score
    truncated = torch.tensor([r == "length" for r in batch.finish_reasons])
    assert row["overlong/truncated_frac"] == pytest.approx(float(truncated.float().mean()))
    assert row["overlong/penalty_mean"] == pytest.approx(float(penalty.mean()))
    # The update ran, and the truncated rows carry no loss and no advantage.
    mask = torch.cat([mb["completion_mask"] for mb in seen["micro_batches"]])
    assert not mask[truncated].any()
    assert mask[~truncated].equal(batch.completion_mask[~truncated])
    adv = torch.cat([mb["advantages"] for mb in seen["micro_batches"]])
    assert (adv[truncated] == 0).all() and (adv[~truncated] != 0).any()
