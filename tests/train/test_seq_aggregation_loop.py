"""The seq_* aggregations through the loop (FakeActor, tiny model, one step): the counts
`PolicyUpdate` hands the loss (tokens N, sequences S, Dr. GRPO's constant L) against hand-counted
ones, with and without overlong-masked rows, and the logged loss computed from them by hand.

The engine is capped at 6 new tokens while rollout.max_new_tokens stays 8, as if every completion
had stopped early: L must be the configured 8, not the longest completion (6) nor the batch's
padded width (prompt + completion)."""

import json

import pytest
import torch
from test_loop_fake_actor import _trainer

from sparrow.train.trainer import GRPOTrainer

MAX_NEW = 8  # rollout.max_new_tokens in test_loop_fake_actor's overrides: Dr. GRPO's L
DRAWN = 6  # what the engine is allowed to draw here


class RecordingLoss:
    """The trainer's PolicyLoss, recording each call's (loss mask, N, StepCounts)."""

    def __init__(self, loss):
        self.loss, self.calls = loss, []

    def __getattr__(self, name):  # everything else PolicyUpdate asks of the loss
        return getattr(self.loss, name)

    def __call__(self, *args, **kwargs):
        self.calls.append((args[4], args[5], kwargs["step"]))
        return self.loss(*args, **kwargs)


def _one_step(tmp_path, aggregation: str, *extra: str, eos_rows: bool = False) -> dict:
    """One step with `aggregation`; returns the batch, the loss calls' (mask, N, counts), the
    update's micro-batches and the logged row. `eos_rows`: every other row made an EOS stop, so
    that rl.overlong.mask_truncated leaves out only the others."""
    trainer: GRPOTrainer = _trainer(
        tmp_path, "rl.steps=1", f"rl.loss.aggregation={aggregation}", *extra
    )
    assert trainer.cfg.rollout.max_new_tokens == MAX_NEW
    trainer.draw.sampling.max_tokens = DRAWN
    loss = RecordingLoss(trainer.policy_update.loss_fn)
    seen = {"calls": loss.calls}
    real_overlong, real_train_step = trainer._overlong, trainer.actor.train_step

    def overlong(scores, batch):
        if eos_rows:
            batch.finish_reasons[::2] = ["eos"] * len(batch.finish_reasons[::2])
        seen["batch"] = batch
        return real_overlong(scores, batch)

    def train_step(micro_batches, loss, temperature, keep=None):
        seen["micro_batches"] = micro_batches
        out = real_train_step(micro_batches, loss, temperature, keep=keep)
        # One dense forward (rl.dense_pass=update): the old log-probs are the forward's own.
        for mb, part in zip(micro_batches, keep.parts, strict=True):
            mb["old_logprobs"] = part[0]
        return out

    trainer.policy_update.loss_fn, trainer._overlong = loss, overlong
    trainer.actor.train_step = train_step
    trainer.fit()
    seen["row"] = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    return seen


def _hand_loss(micro_batches, aggregation: str, sequences: int) -> float:
    """The step's first forward has the old weights (ratio 1): per token -A x the TIS weight
    min(exp(old - rollout), 2); each row's token mean (GRPO) or token sum / L (Dr. GRPO), summed
    and divided by the hand-counted sequences."""
    total = 0.0
    for mb in micro_batches:
        mask = mb["completion_mask"]  # (B, T)
        weight = torch.exp(mb["old_logprobs"] - mb["rollout_logprobs"]).clamp(max=2.0)
        row_sums = torch.where(mask, -mb["advantages"] * weight, 0.0).sum(-1)  # (B,)
        if aggregation == "seq_mean_token_mean":
            total += float((row_sums / mask.sum(-1).clamp(min=1)).sum())
        else:
            total += float(row_sums.sum()) / MAX_NEW
    return total / sequences


def _check(seen, aggregation: str, kept_rows: torch.Tensor) -> None:
    """The loss got N = the kept rows' completion tokens, S = the kept rows, L = MAX_NEW, in
    every micro-batch; the logged loss is the hand-computed one."""
    batch = seen["batch"]
    lengths = batch.completion_mask.sum(-1)  # (B,)
    assert (lengths == DRAWN).all()  # shorter than L...
    assert batch.completion_mask.shape[1] > MAX_NEW  # ... and the padded width is longer
    tokens, sequences = int(lengths[kept_rows].sum()), int(kept_rows.sum())
    assert seen["calls"], "the update never called the loss"
    for mask, num_tokens, counts in seen["calls"]:
        assert int(mask.sum(-1).gt(0).sum()) <= sequences
        assert float(num_tokens) == tokens
        assert (float(counts.tokens), float(counts.sequences)) == (tokens, sequences)
        assert counts.norm_length == MAX_NEW
    mask = torch.cat([mb["completion_mask"] for mb in seen["micro_batches"]])
    assert mask.any(-1).equal(kept_rows)
    adv = torch.cat([mb["advantages"] for mb in seen["micro_batches"]])
    assert adv.abs().sum() > 0  # a loss that the counts move
    expected = _hand_loss(seen["micro_batches"], aggregation, sequences)
    assert seen["row"]["loss/loss"] == pytest.approx(expected, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_seq_aggregation_counts_from_the_loop(tmp_path, aggregation):
    seen = _one_step(tmp_path, aggregation)
    _check(seen, aggregation, kept_rows=torch.ones(len(seen["batch"]), dtype=torch.bool))


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_overlong_masked_rows_are_not_sequences(tmp_path, aggregation):
    """rl.overlong.mask_truncated: the rows cut by the limit carry no tokens and are not counted
    among the S sequences (nor the N tokens)."""
    seen = _one_step(tmp_path, aggregation, "rl.overlong.mask_truncated=true", eos_rows=True)
    truncated = torch.tensor([r == "length" for r in seen["batch"].finish_reasons])
    assert 0 < int(truncated.sum()) < len(truncated)
    _check(seen, aggregation, kept_rows=~truncated)
