"""seq_mask's rejection through the update (sparrow/train/policy_update.py): rejected rows leave
the loss mask before the step's counts are taken, so they count neither in the token_mean
denominator nor in the KL term, as in verl 0.9.1, whose rejection edits the response mask every
later term reads (rollout_corr_helper.compute_rollout_correction_and_add_to_batch; the engine's
batch_num_tokens is the sum of that mask). verl's value is computed below from its own formulas,
restated from its source: compute_rollout_rejection_mask ("seq_mean_k1"),
compute_policy_loss_vanilla, kl_penalty_forward ("low_var_kl") and agg_loss.

The batch: four rows, two rejected (geometric-mean ratios e^1.5 and e^-1.2, outside [0.5, 2]),
every row with a non-zero advantage, and a current policy whose ratios clip on some tokens."""

import math
from types import SimpleNamespace

import pytest
import torch

from sparrow.distributed import Ranks
from sparrow.rl.losses import PolicyLoss
from sparrow.rl.policy_logprobs import LogprobOutput
from sparrow.train.config import SparrowConfig
from sparrow.train.policy_update import PolicyUpdate

LENGTHS = [5, 2, 3, 4]
ADV_ROWS = [1.0, -1.0, -0.5, 2.0]
# d = logp_old - logp_rollout per token; rows 1 and 3 are rejected (mean d 1.5 and -1.2).
D_ROWS = [[0.3, -0.2, 0.1, 0.0, -0.1], [2.5, 0.5], [0.2, -0.4, 0.1], [-1.0, -2.0, -0.8, -1.0]]
LO, HI = 0.5, 2.0  # a band symmetric in log space: verl's [1/HI, 1/LO] is the same band
KL_COEF = 0.1
T = 6


def _batch():
    mask = torch.tensor([[t < n for t in range(T)] for n in LENGTHS])
    gen = torch.Generator().manual_seed(0)
    old = -0.5 - 2.5 * torch.rand(4, T, generator=gen, dtype=torch.float64)
    d = torch.tensor([r + [0.0] * (T - len(r)) for r in D_ROWS], dtype=torch.float64)
    rollout = torch.where(mask, old - d, -50.0)
    adv = torch.tensor(ADV_ROWS, dtype=torch.float64)[:, None] * mask
    return old, rollout, adv, mask


def _current(old):  # the policy being trained: ratios e^(-0.1 old) in [1.05, 1.35]
    return 0.9 * old


def _ref(old):  # the frozen reference
    return 1.2 * old


# ---- verl 0.9.1, restated ----------------------------------------------------------------------


def _verl_loss(old, rollout, adv, mask) -> dict[str, float]:
    mask_f = mask.to(old.dtype)
    log_ratio = (old - rollout).clamp(-20.0, 20.0)  # rollout_corr_helper: SAFETY_BOUND
    seq_k1 = (-log_ratio * mask_f).sum(-1) / (mask_f.sum(-1) + 1e-8)  # masked_mean, seq_mean_k1
    keep = (seq_k1 >= math.log(1 / HI)) & (seq_k1 <= math.log(1 / LO))  # threshold "lo_hi"
    response_mask = mask_f * keep[:, None].to(old.dtype)  # the modified response mask
    logp = _current(old)
    ratio = torch.exp((logp - old).clamp(-20.0, 20.0))  # compute_policy_loss_vanilla
    losses1 = -adv * ratio
    losses2 = -adv * torch.clamp(ratio, 1 - 0.2, 1 + 0.28)
    clip1 = torch.maximum(losses1, losses2)
    clip2 = torch.min(-adv * 3.0, clip1)
    pg_losses = torch.where(adv < 0, clip2, clip1)
    num_tokens = response_mask.sum()  # agg_loss "token-mean", batch_num_tokens
    pg_loss = (pg_losses * response_mask).sum() / num_tokens
    kl = torch.clamp(_ref(old) - logp, min=-20, max=20)  # kl_penalty_forward "low_var_kl"
    kld = torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    kl_loss = (kld * response_mask).sum() / num_tokens
    return {
        "loss": float(pg_loss + KL_COEF * kl_loss),
        "kl_ref": float(kl_loss),
        "masked_frac": float(((1 - response_mask) * mask_f).sum() / mask_f.sum()),
        "kept_rows": int(keep.sum()),
    }


# ---- sparrow's update, on a stand-in actor --------------------------------------------------


class _Actor:
    """Two micro-batches (rows 0 and 1-3), the current log-probs `_current(old)`; sums the
    micro-batch losses and metrics as the actor does."""

    lr = 1e-6

    def micro_batches(self, batch):
        return [{k: v[s] for k, v in batch.items()} for s in (slice(0, 1), slice(1, 4))]

    def train_step(self, micro_batches, loss_fn, temperature, keep=None):
        assert keep is None, "seq_mask reads a separate dense pass (rl.dense_pass's fallback)"
        sums = {"loss": 0.0}
        for mb in micro_batches:
            loss, metrics = loss_fn(_current(mb["old_logprobs"]), mb)
            sums["loss"] += float(loss)
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        return sums


class _Reference:
    def token_logprobs(self, mb, temperature):
        return _ref(mb["old_logprobs"])


def _sparrow(aggregation: str, mode: str = "seq_mask") -> dict:
    old, rollout, adv, mask = _batch()
    cfg = SparrowConfig()
    cfg.rl.correction.mode, cfg.rl.correction.lo, cfg.rl.correction.hi = mode, LO, HI
    cfg.rl.loss.kl_coef, cfg.rl.loss.aggregation = KL_COEF, aggregation
    batch = SimpleNamespace(
        input_ids=torch.zeros(4, T, dtype=torch.long),
        attention_mask=torch.ones(4, T, dtype=torch.bool),
        completion_mask=mask,
        drawn_logprobs=rollout,
        prompt_lens=torch.zeros(4, dtype=torch.long),
        group_ids=torch.tensor([0, 0, 1, 1]),
    )
    dense = LogprobOutput(old, None, None, None)
    loss_fn = PolicyLoss(cfg.rl.loss, cfg.rl.correction)
    update = PolicyUpdate(_Actor(), loss_fn, _Reference(), Ranks(0, 1), cfg)
    outcome = update(batch, dense, adv, float(mask.sum()))
    assert outcome.ran
    return outcome.metrics


def test_rejected_rows_leave_the_token_count_and_the_kl_term_as_in_verl():
    old, rollout, adv, mask = _batch()
    verl = _verl_loss(old, rollout, adv, mask)
    assert verl["kept_rows"] == 2  # the data rejects rows 1 and 3
    ours = _sparrow("token_mean")
    assert ours["loss"] == pytest.approx(verl["loss"], rel=1e-12)
    assert ours["kl_ref"] == pytest.approx(verl["kl_ref"], rel=1e-12)
    assert ours["correction/masked_frac"] == pytest.approx(verl["masked_frac"], rel=1e-12)
    assert verl["masked_frac"] == 6 / 14


def test_seq_mean_token_mean_counts_the_rows_left_in_the_loss():
    """S is the rows the loss keeps, as for overlong-masked rows; verl 0.9.1 divides its seq-mean
    modes by the mini-batch's sequences (ppo_mini_batch_size x n), rejected rows included, so its
    value is 2/4 of this one on this batch."""
    old, rollout, adv, mask = _batch()
    logp = _current(old)
    ratio = torch.exp(logp - old)
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
    per_token = torch.where(adv < 0, torch.min(-adv * 3.0, per_token), per_token)
    d = _ref(old) - logp
    per_token = per_token + KL_COEF * (torch.exp(d) - d - 1)  # no token reaches k3's bound
    kept = [0, 2]
    want = sum(float(per_token[r, : LENGTHS[r]].mean()) for r in kept) / len(kept)
    assert _sparrow("seq_mean_token_mean")["loss"] == pytest.approx(want, rel=1e-12)


def test_modes_without_rejection_keep_every_token_counted():
    """token_mask zeroes weights but, like verl's IcePop weights, leaves the tokens counted."""
    old, _, _, mask = _batch()
    metrics = _sparrow("token_mean", mode="token_mask")
    logp = _current(old)
    d = _ref(old) - logp
    kl = torch.where(mask, torch.exp(d) - d - 1, 0.0).sum() / mask.sum()
    assert metrics["kl_ref"] == pytest.approx(float(kl), rel=1e-12)
