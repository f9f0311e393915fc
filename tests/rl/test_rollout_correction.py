"""Rollout correction modes (sparrow/rl/rollout_correction.py): each equals a hand computation and
the formula of the peer it is named after, on a batch with padding, an all-equal group and
extreme ratios; the weights carry no gradient; the default `tis` is today's loss bit for bit.

The peer formulas below restate, in a few lines each, what these versions compute (read from
their released source):
- verl 0.9.1, verl/trainer/ppo/rollout_corr_helper.py: `compute_rollout_correction_weights`
  (rollout_is "token"/"sequence", threshold C or "lo_hi" = IcePop) and
  `compute_rollout_rejection_mask` (rollout_rs "seq_mean_k1", bounds "lo_hi");
- OpenRLHF 0.11.2, openrlhf/models/loss.py `PolicyLoss` (is_correction_level=token,
  is_correction_mode=mask, gating=ratio: ICEPOP);
- TRL 1.16.0, trl/trainer/grpo_trainer.py (vllm_importance_sampling_mode token_truncate,
  token_mask, sequence_truncate);
- SkyRL 0.3.0, skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py
  (`compute_tis_ratio` token/sequence, `compute_sequence_mask` geometric).
"""

import math

import pytest
import torch

from sparrow.rl.losses import METRIC_REDUCTIONS, LossConfig, PolicyLoss
from sparrow.rl.rollout_correction import CorrectionConfig, make_correction, make_rejection

CAP, LO, HI = 2.0, 0.5, 5.0
# d = logp_old - logp_rollout per completion token; rows are right-padded to 4 tokens.
# Rows 0-1 are a group with signal (A = +1, -1); rows 2-3 a group whose rewards were all equal
# (A = 0). Row 1 holds an extreme ratio e^25 (clamped at e^20), row 2 an extreme e^-30.
D_ROWS = [
    [math.log(3.0), math.log(0.25), 0.0, math.log(1.5)],
    [25.0, -0.1],
    [-30.0, 0.2, 0.1],
    [math.log(0.9)],
]
ADV_ROWS = [1.0, -1.0, 0.0, 0.0]
T = 4


def _batch(dtype=torch.float64, padding=-50.0):
    """(old, rollout, adv, mask) (4, T); off the completion, rollout holds `padding` garbage (a
    huge ratio if it leaked)."""
    mask = torch.tensor([[i < len(r) for i in range(T)] for r in D_ROWS])
    d = torch.tensor([r + [0.0] * (T - len(r)) for r in D_ROWS], dtype=dtype)
    old = torch.linspace(-3.0, -0.5, 4 * T, dtype=dtype).reshape(4, T)
    rollout = torch.where(mask, old - d, torch.tensor(padding, dtype=dtype))
    adv = torch.tensor(ADV_ROWS, dtype=dtype)[:, None].expand(4, T) * mask
    return old, rollout, adv, mask


def _clamped_exp(x: float) -> float:
    return math.exp(min(max(x, -20.0), 20.0))


def _hand_weights(mode: str) -> list[list[float]]:
    """Each mode's weight per completion token, from the definitions, in plain Python."""
    rows = []
    for d in D_ROWS:
        ratios = [_clamped_exp(x) for x in d]
        seq = _clamped_exp(sum(d))
        geo = math.exp(sum(min(max(x, -20.0), 20.0) for x in d) / len(d))  # each d clamped first
        rows.append(
            {
                "tis": [min(r, CAP) for r in ratios],
                "token_mask": [r if LO <= r <= HI else 0.0 for r in ratios],
                "seq_tis": [min(seq, CAP)] * len(d),
                "seq_mask": [1.0 if LO <= geo <= HI else 0.0] * len(d),
                "none": [1.0] * len(d),
            }[mode]
        )
    return rows


# What the hand weights are, spelled out for the reader (and checked against _hand_weights):
#   tis:        [2, .25, 1, 1.5] [2, e^-.1] [e^-20, e^.2, e^.1] [.9]   truncated: 2 of 10 tokens
#   token_mask: [3, 0, 1, 1.5]   [0, e^-.1] [0, e^.2, e^.1]     [.9]   masked: 3 of 10
#   seq_tis:    1.125 x4         2 x2 (e^24.9)  e^-20 x3          .9   truncated: 2 of 10
#   seq_mask:   1 x4 (geo 1.03)  0 x2 (e^9.95)  0 x3 (e^-6.57)    1    masked: 5 of 10
EXPECTED_FRACS = {
    "tis": (0.2, 0.0),
    "token_mask": (0.0, 0.3),
    "seq_tis": (0.2, 0.0),
    "seq_mask": (0.0, 0.5),
    "none": (0.0, 0.0),
}


def _rows(t: torch.Tensor, mask: torch.Tensor) -> list[list[float]]:
    return [t[b][mask[b]].tolist() for b in range(len(t))]


@pytest.mark.parametrize("mode", ["tis", "token_mask", "seq_tis", "seq_mask", "none"])
def test_each_mode_equals_the_hand_computation(mode):
    old, rollout, adv, mask = _batch()
    c = make_correction(CorrectionConfig(mode=mode, cap=CAP, lo=LO, hi=HI))(old, rollout, mask)
    for got, want in zip(_rows(c.weight, mask), _hand_weights(mode), strict=True):
        assert got == pytest.approx(want, rel=1e-12, abs=0)
    n = int(mask.sum())
    assert (float(c.truncated[mask].sum()) / n, float(c.masked[mask].sum()) / n) == pytest.approx(
        EXPECTED_FRACS[mode]
    )


def test_hand_weights_read_as_the_comment_says():
    assert _hand_weights("seq_tis")[0][0] == pytest.approx(1.125)
    assert _hand_weights("seq_mask") == [[1.0] * 4, [0.0] * 2, [0.0] * 3, [1.0]]
    assert _hand_weights("token_mask")[1] == [0.0, pytest.approx(math.exp(-0.1))]


# ---- the peers' formulas, restated ------------------------------------------------------------


def _verl_is_weights(log_ratio, mask, level, threshold):
    """verl 0.9.1 compute_rollout_correction_weights (no batch normalisation)."""
    m = mask.to(log_ratio.dtype)
    if level == "token":
        raw = torch.exp(log_ratio.clamp(-20.0, 20.0))
    else:
        s = (torch.where(mask, log_ratio, 0.0) * m).sum(-1, keepdim=True)
        raw = torch.exp(s.clamp(-20.0, 20.0)).expand_as(log_ratio)
    raw = raw * m
    if isinstance(threshold, str):  # "lo_hi": IcePop
        lo, hi = (float(x) for x in threshold.split("_"))
        return torch.where((raw >= lo) & (raw <= hi), raw, torch.zeros_like(raw))
    return raw.clamp(max=threshold)


def _verl_geo_rs_keep(log_ratio, mask, lo, hi):
    """verl 0.9.1 compute_rollout_rejection_mask, rollout_rs="seq_mean_k1", threshold "lo_hi"."""
    k1 = -log_ratio.clamp(-20.0, 20.0)
    m = mask.to(log_ratio.dtype)
    stat = (torch.where(mask, k1, 0.0) * m).sum(-1) / (m.sum(-1) + 1e-8)
    return ((stat >= math.log(lo)) & (stat <= math.log(hi)))[:, None].expand_as(mask)


def _openrlhf_icepop(old, rollout, mask, lo, hi):
    """OpenRLHF 0.11.2 PolicyLoss, is_correction_level=token, mode=mask, gating=ratio."""
    token_is = (old - rollout).detach().exp()
    keep = (token_is >= lo) & (token_is <= hi)
    return torch.where(keep, token_is, 0.0)


def _trl_weights(old, sampling, mask, mode, clip_max, clip_min=None):
    """TRL 1.16.0 GRPOTrainer importance_sampling_ratio (vllm_importance_sampling_mode)."""
    diff = (old - sampling) * mask
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max).expand_as(old)
    low = clip_min if clip_min is not None else -math.inf
    return ratio.masked_fill((ratio < low) | (ratio > clip_max), 0.0).expand_as(old)


def _skyrl_tis(old, rollout, mask, level, cap):
    """SkyRL 0.3.0 compute_tis_ratio (safe_exp_delta: clamp +-20, exp in fp32)."""
    d = old - rollout
    if level == "sequence":
        d = (d * mask).sum(-1, keepdim=True)
    return d.float().clamp(-20.0, 20.0).exp().to(old.dtype).clamp(max=cap).expand_as(old)


def _skyrl_geo_keep(old, rollout, mask, lo, hi):
    """SkyRL 0.3.0 compute_sequence_mask, sequence_mask_metric="geometric"."""
    m = mask.to(old.dtype)
    n = m.sum(-1, keepdim=True).clamp(min=1.0)
    geo = (((old - rollout) * m).sum(-1, keepdim=True) / n).float().clamp(-20, 20).exp()
    return (~(geo > hi) & ~(geo < lo)).expand_as(mask)


def _correction(mode, old, rollout, mask):
    return make_correction(CorrectionConfig(mode=mode, cap=CAP, lo=LO, hi=HI))(old, rollout, mask)


def test_tis_equals_verl_trl_skyrl_token_truncation():
    old, rollout, _, mask = _batch()
    w = _correction("tis", old, rollout, mask).weight
    peers = {
        "verl": _verl_is_weights(old - rollout, mask, "token", CAP),
        "trl": _trl_weights(old, rollout, mask, "token_truncate", CAP),
        "skyrl": _skyrl_tis(old, rollout, mask, "token", CAP),
    }
    # TRL does not clamp d: it differs only on row 2's e^-30, which the others floor at e^-20.
    unclamped = mask & ((old - rollout).abs() <= 20)
    for name, peer in peers.items():
        on = unclamped if name == "trl" else mask
        torch.testing.assert_close(w[on], peer[on], rtol=1e-7, atol=0, msg=name)
    assert w[2, 0].item() == pytest.approx(math.exp(-20)) and peers["trl"][2, 0] < 1e-12


def test_token_mask_equals_openrlhf_icepop_verl_icepop_trl_token_mask():
    old, rollout, _, mask = _batch()
    w = _correction("token_mask", old, rollout, mask).weight
    peers = {
        "openrlhf": _openrlhf_icepop(old, rollout, mask, LO, HI),
        "verl": _verl_is_weights(old - rollout, mask, "token", f"{LO}_{HI}"),
        "trl": _trl_weights(old, rollout, mask, "token_mask", HI, LO),
    }
    for name, peer in peers.items():
        torch.testing.assert_close(w[mask], peer[mask], rtol=1e-12, atol=0, msg=name)


def test_seq_tis_equals_verl_skyrl_sequence_is_and_trl_sequence_truncate():
    old, rollout, _, mask = _batch()
    w = _correction("seq_tis", old, rollout, mask).weight
    peers = {
        "verl": _verl_is_weights(old - rollout, mask, "sequence", CAP),
        "skyrl": _skyrl_tis(old, rollout, mask, "sequence", CAP),
        "trl": _trl_weights(old, rollout, mask, "sequence_truncate", CAP),
    }
    # TRL does not clamp S either: row 2's e^-29.7 is floored at e^-20 by the others.
    for name, peer in peers.items():
        rows = [0, 1, 3] if name == "trl" else [0, 1, 2, 3]
        torch.testing.assert_close(w[rows][mask[rows]], peer[rows][mask[rows]], rtol=1e-7, atol=0)
    assert w[2, 0].item() == pytest.approx(math.exp(-20)) and peers["trl"][2, 0] < 1e-12


def test_seq_mask_equals_verl_geometric_rejection_and_skyrl_geometric_mask():
    old, rollout, _, mask = _batch()
    keep = _correction("seq_mask", old, rollout, mask).weight.bool()
    assert torch.equal(keep[mask], _skyrl_geo_keep(old, rollout, mask, LO, HI)[mask])
    # verl bounds -mean(d) to [log lo, log hi]: the ratio band [1/hi, 1/lo].
    assert torch.equal(keep[mask], _verl_geo_rs_keep(old - rollout, mask, 1 / HI, 1 / LO)[mask])
    # A tight symmetric band, as verl's and SkyRL's defaults are: drops row 3 (geo 0.9) too.
    lo, hi = 1 / 1.05, 1.05
    tight = make_correction(CorrectionConfig(mode="seq_mask", lo=lo, hi=hi))(old, rollout, mask)
    tight_keep = tight.weight.bool()
    assert torch.equal(tight_keep[mask], _verl_geo_rs_keep(old - rollout, mask, lo, hi)[mask])
    assert torch.equal(tight_keep[mask], _skyrl_geo_keep(old, rollout, mask, lo, hi)[mask])
    assert tight_keep[0, 0] and not tight_keep[3, 0] and keep[3, 0]


def test_seq_mask_clamps_each_log_ratio_to_20_before_the_mean_as_verl_does():
    """Rows holding a token with |d| > 20: verl's seq_mean_k1 clamps every token's log-ratio to
    +-20 (SAFETY_BOUND) before taking the row's mean, and so does sparrow; SkyRL averages first,
    so on rows 0 and 1 it rejects what verl and sparrow keep (band [0.5, 5]: log -0.69 to 1.61)."""
    d_rows = [
        [25.0, -4.0, -4.0, -4.0, -4.0],  # (20 - 16) / 5 = 0.8 kept; unclamped 1.8 (e^1.8 = 6.05)
        [-30.0, 4.0, 4.0, 4.0, 4.0, 4.0],  # (-20 + 20) / 6 = 0 kept; unclamped -1.67 (e^ = 0.19)
        [25.0, -0.1],  # (20 - 0.1) / 2 = 9.95: rejected either way
    ]
    width = max(map(len, d_rows))
    mask = torch.tensor([[t < len(r) for t in range(width)] for r in d_rows])
    d = torch.tensor([r + [0.0] * (width - len(r)) for r in d_rows], dtype=torch.float64)
    old = torch.where(d < 0, d - 1.0, -1.0)  # realistic log-probs both ways: d = old - rollout
    rollout = torch.where(mask, old - d, -50.0)  # padding garbage: a huge ratio if it leaked
    c = _correction("seq_mask", old, rollout, mask)
    assert _rows(c.weight, mask) == [[1.0] * 5, [1.0] * 6, [0.0] * 2]
    assert _rows(c.rejected, mask) == [[False] * 5, [False] * 6, [True] * 2]
    rejection = make_rejection(CorrectionConfig(mode="seq_mask", lo=LO, hi=HI))
    assert torch.equal(rejection(old, rollout, mask), c.rejected & mask)  # the update's path
    verl = _verl_geo_rs_keep(old - rollout, mask, 1 / HI, 1 / LO)
    assert torch.equal(c.weight.bool()[mask], verl[mask])
    skyrl = _skyrl_geo_keep(old, rollout, mask, LO, HI)
    assert skyrl[:, 0].tolist() == [False, False, False]


# ---- through the loss -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["tis", "token_mask", "seq_tis", "seq_mask", "none"])
def test_loss_is_the_weighted_token_mean_and_only_logprobs_get_gradient(mode):
    """At logp = logp_old the PPO surrogate is -A per token, so loss = sum(-A w) / N and
    dloss/dlogp = -A w / N; the all-equal group (A = 0) adds nothing whatever its weights."""
    old, rollout, adv, mask = _batch()
    old, rollout = old.clone().requires_grad_(True), rollout.clone().requires_grad_(True)
    logp = old.detach().clone().requires_grad_(True)
    n = int(mask.sum())
    cfg = CorrectionConfig(mode=mode, cap=CAP, lo=LO, hi=HI)
    loss, m = PolicyLoss(LossConfig(), cfg)(logp, old, rollout, adv, mask, n)
    hand = _hand_weights(mode)
    want = sum(-a * w for a, ws in zip(ADV_ROWS, hand, strict=True) for w in ws) / n
    assert loss.item() == pytest.approx(want, rel=1e-12)
    loss.backward()
    assert old.grad is None and rollout.grad is None  # the weight is detached
    grads = _rows(logp.grad, mask)
    for a, ws, g in zip(ADV_ROWS, hand, grads, strict=True):
        assert g == pytest.approx([-a * w / n for w in ws], rel=1e-12, abs=1e-300)
    flat = [w for ws in hand for w in ws]
    # metrics are taken in fp32
    assert m["correction/weight_mean"].item() == pytest.approx(sum(flat) / n, rel=1e-6)
    assert m["correction/weight_min"].item() == pytest.approx(min(flat), rel=1e-6)
    assert m["correction/weight_max"].item() == pytest.approx(max(flat), rel=1e-6)
    truncated, masked = EXPECTED_FRACS[mode]
    assert m["correction/truncated_frac"].item() == pytest.approx(truncated)
    assert m["correction/masked_frac"].item() == pytest.approx(masked)


@pytest.mark.parametrize("mode", ["tis", "token_mask", "seq_tis", "seq_mask"])
def test_metrics_and_loss_reduce_over_micro_batches_like_the_whole_batch(mode):
    old, rollout, adv, mask = _batch()
    logp = old + 0.05
    loss_fn = PolicyLoss(LossConfig(), CorrectionConfig(mode=mode, cap=CAP, lo=LO, hi=HI))
    n = int(mask.sum())
    whole_loss, whole = loss_fn(logp, old, rollout, adv, mask, n)
    parts = [
        loss_fn(logp[s], old[s], rollout[s], adv[s], mask[s], n) for s in (slice(0, 1), slice(1, 4))
    ]
    assert sum(p[0].item() for p in parts) == pytest.approx(whole_loss.item(), rel=1e-12)
    for key in (k for k in METRIC_REDUCTIONS if k.startswith("correction/")):
        values = torch.stack([p[1][key] for p in parts])
        reduced = {"sum": values.sum(), "min": values.min(), "max": values.max()}
        assert reduced[METRIC_REDUCTIONS[key]].item() == pytest.approx(whole[key].item()), key


def test_padding_with_minus_inf_log_probs_stays_out():
    old, rollout, adv, mask = _batch(padding=-math.inf)
    for mode in ("tis", "token_mask", "seq_tis", "seq_mask", "none"):
        c = _correction(mode, old, rollout, mask)
        assert torch.isfinite(c.weight).all(), mode
        for got, want in zip(_rows(c.weight, mask), _hand_weights(mode), strict=True):
            assert got == pytest.approx(want, rel=1e-12), mode


# ---- today's loss, bit for bit ----------------------------------------------------------------


def _todays_default_loss(logp, old, rollout, adv, mask, n):
    """PolicyLoss(LossConfig()) as of 57db0d9 (rl.loss.tis_cap = 2, dual clip 3), op for op."""
    ratio = torch.exp((logp - old.detach()).clamp(-20.0, 20.0))
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - 0.2, 1.0 + 0.28))
    cap = -adv * 3.0
    pg = torch.where((adv < 0) & (pg > cap), cap, pg)
    w = torch.exp((old - rollout).detach().clamp(-20.0, 20.0)).clamp(max=2.0)
    pg = pg * w
    return torch.where(mask, pg, torch.zeros_like(pg)).sum() / n


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_default_tis_is_todays_loss_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(3)
    B, T = 6, 9
    old = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    logp0 = old + 0.4 * torch.randn(B, T, generator=g, dtype=dtype)  # ratios clip both ways
    rollout = old + 1.5 * torch.randn(B, T, generator=g, dtype=dtype)  # weights truncate
    adv = torch.randn(B, 1, generator=g, dtype=dtype).expand(B, T)
    mask = torch.rand(B, T, generator=g) < 0.8
    n = int(mask.sum())
    new, ref = logp0.clone().requires_grad_(True), logp0.clone().requires_grad_(True)
    loss, m = PolicyLoss(LossConfig())(new, old, rollout, adv, mask, n)
    today = _todays_default_loss(ref, old, rollout, adv, mask, n)
    loss.backward()
    today.backward()
    assert torch.equal(loss, today)
    assert torch.equal(new.grad, ref.grad)
    # The data exercises every branch: both clips and the truncation.
    for key in ("clip_frac_low", "clip_frac_high", "correction/truncated_frac"):
        assert m[key].item() > 0, key


def test_config_is_validated():
    with pytest.raises(ValueError, match="rl.correction.mode='icepop'"):
        CorrectionConfig(mode="icepop")
    with pytest.raises(ValueError, match="lo <= hi"):
        CorrectionConfig(lo=2.0, hi=1.0)
    with pytest.raises(ValueError, match="cap > 0"):
        CorrectionConfig(cap=0.0)


def test_seq_mask_rejected_rows_leave_the_kl_term():
    """Called directly (the update cuts the rows from the mask before, train/policy_update.py),
    the loss still leaves the rejected rows (1 and 2) out of the KL term, as verl's rejection
    leaves them out of the response mask its KL loss sums over; token_mask's zero weights do not."""
    old, rollout, adv, mask = _batch()
    ref = old - 0.3  # logp = old: d = logp_ref - logp = -0.3 on every token
    k3 = math.exp(-0.3) + 0.3 - 1
    for mode, kl_tokens in (("seq_mask", 5), ("token_mask", 10)):
        cfg = CorrectionConfig(mode=mode, cap=CAP, lo=LO, hi=HI)
        loss_fn = PolicyLoss(LossConfig(kl_coef=0.5), cfg)
        rejection = make_rejection(cfg)
        rejected = torch.zeros_like(mask) if rejection is None else rejection(old, rollout, mask)
        assert int(rejected.sum()) == 10 - kl_tokens and (rejection is None) == (mode != "seq_mask")
        n = int((mask & ~rejected).sum())
        _, m = loss_fn(old.clone(), old, rollout, adv, mask, n, ref_logprobs=ref)
        assert m["kl_ref"].item() == pytest.approx(kl_tokens * k3 / n, rel=1e-12), mode
