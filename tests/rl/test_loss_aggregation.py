"""Loss aggregation (rl.loss.aggregation): each mode equals its formula computed by hand (verl
0.9.1's `agg_loss` for token-mean and seq-mean-token-mean, the Dr. GRPO paper's constant
normaliser for seq_mean_token_sum_norm) on a batch with padding, an all-equal group and extreme
ratios, and gives the same loss and gradient for any micro-batch split."""

import pytest
import torch

from sparrow.rl.losses import AGGREGATIONS, LossConfig, PolicyLoss, StepCounts
from sparrow.rl.rollout_correction import CorrectionConfig

LENGTHS = [5, 3, 1, 4]  # completion tokens per row; the rest is padding
ADV_ROWS = [1.0, -0.5, 0.0, 2.0]  # row 2: an all-equal group's zero advantage
MAX_NEW = 6  # Dr. GRPO's L


def batch():
    mask = torch.zeros(4, 5, dtype=torch.bool)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = True
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 5, generator=gen, dtype=torch.float64) * 3
    log_ratio = torch.randn(4, 5, generator=gen, dtype=torch.float64) * 0.3
    log_ratio[0, 1], log_ratio[3, 2] = 30.0, -30.0  # extreme ratios, clamped and clipped
    old[~mask] = -torch.inf  # padding as the actor leaves it
    adv = torch.tensor(ADV_ROWS, dtype=torch.float64)[:, None].expand(4, 5).clone()
    return old + log_ratio, old, adv, mask


def token_losses(logp, old, adv):
    """PPO clip-higher [0.8, 1.28] and dual clip 3, per token, by hand."""
    ratio = torch.exp((logp - old).clamp(-20, 20))
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
    return torch.where((adv < 0) & (loss > -3 * adv), -3 * adv, loss)


def by_hand(mode, logp, old, adv, mask) -> float:
    per_token = token_losses(logp, old, adv)
    rows = [per_token[r, :n].tolist() for r, n in enumerate(LENGTHS)]
    if mode == "token_mean":  # verl: masked_mean(loss_mat, loss_mask)
        return sum(map(sum, rows)) / sum(LENGTHS)
    if mode == "seq_mean_token_mean":  # verl: mean(sum(loss * mask, -1) / sum(mask, -1))
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    return sum(sum(r) / MAX_NEW for r in rows) / len(rows)  # Dr. GRPO: (1/G) sum_i sum_t / L


def loss_of(mode, rows: slice, logp, old, adv, mask):
    fn = PolicyLoss(LossConfig(aggregation=mode), CorrectionConfig(mode="none"))
    step = StepCounts(tokens=int(mask.sum()), sequences=len(LENGTHS), norm_length=MAX_NEW)
    loss, _ = fn(logp[rows], old[rows], old[rows], adv[rows], mask[rows], step.tokens, step=step)
    return loss


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_each_mode_equals_its_formula(mode):
    logp, old, adv, mask = batch()
    loss = loss_of(mode, slice(None), logp, old, adv, mask)
    assert loss.item() == pytest.approx(by_hand(mode, logp, old, adv, mask), rel=1e-12)


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_any_micro_batch_split_gives_the_same_loss_and_gradient(mode):
    logp, old, adv, mask = batch()
    whole = logp.clone().requires_grad_(True)
    loss_of(mode, slice(None), whole, old, adv, mask).backward()
    split = logp.clone().requires_grad_(True)
    parts = [
        loss_of(mode, s, split, old, adv, mask) for s in (slice(0, 1), slice(1, 3), slice(3, 4))
    ]
    sum(parts).backward()
    assert sum(p.item() for p in parts) == pytest.approx(
        loss_of(mode, slice(None), logp, old, adv, mask).item(), rel=1e-12
    )
    torch.testing.assert_close(split.grad, whole.grad, rtol=1e-12, atol=0)
    assert (whole.grad[~mask] == 0).all() and (whole.grad[2] == 0).all()  # padding, A = 0


def test_modes_weigh_long_and_short_answers_differently():
    """The point of the modes: seq_mean_token_mean gives the 1-token row the weight of the
    5-token row; token_mean and Dr. GRPO weigh each token alike."""
    logp, old, adv, mask = batch()
    grads = {}
    for mode in AGGREGATIONS:
        x = logp.clone().requires_grad_(True)
        loss_of(mode, slice(None), x, old, adv, mask).backward()
        grads[mode] = x.grad
    token, seq, drgrpo = (grads[m] for m in AGGREGATIONS)
    torch.testing.assert_close(drgrpo, token * sum(LENGTHS) / (len(LENGTHS) * MAX_NEW))
    torch.testing.assert_close(seq[1, :3], token[1, :3] * sum(LENGTHS) / (len(LENGTHS) * 3))


def test_seq_modes_need_the_step_counts_and_bad_names_are_refused():
    logp, old, adv, mask = batch()
    fn = PolicyLoss(LossConfig(aggregation="seq_mean_token_mean"), CorrectionConfig(mode="none"))
    with pytest.raises(ValueError, match="step's counts"):
        fn(logp, old, old, adv, mask, 13)
    with pytest.raises(ValueError, match="rl.loss.aggregation='seq-mean'"):
        LossConfig(aggregation="seq-mean")
