"""Policy loss: clipping, dual clip, TIS, global-token-mean invariance, KL, entropy. The other
rollout-correction modes: tests/rl/test_rollout_correction.py."""

import math

import pytest
import torch

from sparrow.rl.losses import (
    METRIC_REDUCTIONS,
    LossConfig,
    PolicyLoss,
    kl_k1,
    kl_k3,
    kl_k3_bounded,
)
from sparrow.rl.rollout_correction import CorrectionConfig

NO_CORRECTION = CorrectionConfig(mode="none")

# Five tokens, one sequence: (advantage, ratio r = exp(logp - logp_old)).
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, 2.0]])
RATIO = torch.tensor([[1.5, 0.5, 0.5, 1.5, 1.1]], dtype=torch.float64)
# clip range [0.8, 1.28]; per-token loss max(-A r, -A clip(r)):
#   A=+1 r=1.5 -> -1.28 (high clip binds)   A=+1 r=0.5 -> -0.5 (no clip)
#   A=-1 r=0.5 -> 0.8 (low clip binds)      A=-1 r=1.5 -> 1.5 (no clip; dual clip c=1.4 -> 1.4)
#   A=+2 r=1.1 -> -2.2
TOKEN_LOSS = [-1.28, -0.5, 0.8, 1.5, -2.2]


def _inputs(tis_log_weight=None):
    old = torch.full((1, 5), -1.0, dtype=torch.float64)
    logp = (old + RATIO.log()).requires_grad_(True)
    rollout = old.clone() if tis_log_weight is None else old - tis_log_weight
    mask = torch.ones(1, 5, dtype=torch.bool)
    return logp, old, rollout, ADV.double(), mask


def test_clip_both_sides_hand_values_and_gradients():
    loss_fn = PolicyLoss(LossConfig(), NO_CORRECTION)
    logp, old, rollout, adv, mask = _inputs()
    loss, m = loss_fn(logp, old, rollout, adv, mask, global_num_tokens=5)
    assert loss.item() == pytest.approx(sum(TOKEN_LOSS) / 5)
    assert m["clip_frac_high"].item() == pytest.approx(1 / 5)
    assert m["clip_frac_low"].item() == pytest.approx(1 / 5)
    assert m["dual_clip_frac"].item() == 0.0
    loss.backward()
    # d(-A r)/dlogp = -A r on unclipped tokens, 0 where a clip binds; then / 5 tokens.
    expected = torch.tensor([[0.0, -0.5, 0.0, 1.5, -2.2]], dtype=torch.float64) / 5
    torch.testing.assert_close(logp.grad, expected)


def test_dual_clip_caps_negative_advantage_loss():
    logp, old, rollout, adv, mask = _inputs()
    loss, m = PolicyLoss(LossConfig(dual_clip=1.4), NO_CORRECTION)(logp, old, rollout, adv, mask, 5)
    expected = TOKEN_LOSS.copy()
    expected[3] = 1.4
    assert loss.item() == pytest.approx(sum(expected) / 5)
    assert m["dual_clip_frac"].item() == pytest.approx(1 / 5)
    loss.backward()
    assert logp.grad[0, 3].item() == 0.0  # capped: no gradient
    with pytest.raises(ValueError, match="dual_clip"):
        PolicyLoss(LossConfig(dual_clip=1.0))


def test_tis_weight_truncates_and_multiplies():
    # exp(old - rollout) = 3, 0.5, 1, 2, 1; cap 2 truncates the first only.
    log_w = torch.tensor([[math.log(3), math.log(0.5), 0.0, math.log(2), 0.0]], dtype=torch.float64)
    logp, old, rollout, adv, mask = _inputs(log_w)
    loss, m = PolicyLoss(LossConfig(), CorrectionConfig(cap=2.0))(logp, old, rollout, adv, mask, 5)
    weights = [2.0, 0.5, 1.0, 2.0, 1.0]
    weighted = sum(w * t for w, t in zip(weights, TOKEN_LOSS, strict=True))
    assert loss.item() == pytest.approx(weighted / 5)
    assert m["correction/truncated_frac"].item() == pytest.approx(1 / 5)
    assert m["correction/masked_frac"].item() == 0.0
    assert m["correction/weight_mean"].item() == pytest.approx(sum(weights) / 5)
    assert m["correction/weight_min"].item() == pytest.approx(0.5)
    assert m["correction/weight_max"].item() == pytest.approx(2.0)
    loss.backward()
    # The weight is detached: gradient is weight x the PPO gradient.
    assert logp.grad[0, 1].item() == pytest.approx(0.5 * -0.5 / 5)
    # No correction: the loss ignores the ratios, and the weight applied is 1.
    logp, old, rollout, adv, mask = _inputs(log_w)
    loss_off, m_off = PolicyLoss(LossConfig(), NO_CORRECTION)(logp, old, rollout, adv, mask, 5)
    assert loss_off.item() == pytest.approx(sum(TOKEN_LOSS) / 5)
    assert m_off["correction/weight_max"].item() == 1.0
    assert m_off["correction/truncated_frac"].item() == 0.0


def _random_step(seed=0, B=8, T=6, V=11):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, V, (B, T), generator=g)
    old = torch.log_softmax(logits.detach() + 0.3 * torch.randn(B, T, V, generator=g), -1)
    old = old.gather(-1, ids[..., None])[..., 0]
    rollout = old + 0.8 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = old + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T)
    mask = torch.rand(B, T, generator=g) < 0.7  # ragged completions
    return logits, ids, old, rollout, ref, adv, mask


def test_loss_and_gradient_independent_of_micro_batch_split():
    cfg = LossConfig(dual_clip=1.5, kl_coef=0.1, kl_estimator="k3")
    loss_fn = PolicyLoss(cfg, CorrectionConfig(cap=2.0))
    results = []
    for micro in (8, 2):  # 1 x 8 and 4 x 2
        logits, ids, old, rollout, ref, adv, mask = _random_step()
        n = int(mask.sum())
        total, metrics = 0.0, []
        for s in range(0, 8, micro):
            sl = slice(s, s + micro)
            logp = torch.log_softmax(logits[sl], -1).gather(-1, ids[sl][..., None])[..., 0]
            loss, m = loss_fn(
                logp, old[sl], rollout[sl], adv[sl], mask[sl], n, ref_logprobs=ref[sl]
            )
            loss.backward()  # gradients accumulate, as over micro-batches in the trainer
            total += loss.item()
            metrics.append(m)
        reduced = {}
        for k, how in METRIC_REDUCTIONS.items():
            if k in metrics[0]:
                vals = torch.stack([m[k] for m in metrics])
                reduced[k] = {"sum": vals.sum(), "min": vals.min(), "max": vals.max()}[how]
        results.append((total, logits.grad.clone(), reduced))
    (l1, g1, m1), (l4, g4, m4) = results
    assert l1 == pytest.approx(l4, rel=1e-12)
    assert g1.abs().max() > 0
    torch.testing.assert_close(g1, g4, rtol=1e-12, atol=1e-15)
    assert m1.keys() == m4.keys() and "kl_ref" in m1
    for k in ("clip_frac_low", "clip_frac_high", "dual_clip_frac", "correction/truncated_frac"):
        assert m1[k] > 0, k  # every branch of the loss is exercised by this data
    for k in m1:
        torch.testing.assert_close(m1[k], m4[k])


def test_kl_estimators_hand_values():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert kl_k1(logp, ref).item() == pytest.approx(math.log(2))
    # d = log(0.25 / 0.5) = -ln 2: exp(d) - d - 1 = 0.5 + ln 2 - 1
    assert kl_k3(logp, ref).item() == pytest.approx(0.5 + math.log(2) - 1)
    assert kl_k3(ref, ref).item() == 0.0


def test_kl_estimators_are_unbiased_over_a_full_distribution():
    pi = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    ref = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    kl = (pi * (pi / ref).log()).sum()
    assert (pi * kl_k1(pi.log(), ref.log())).sum().item() == pytest.approx(kl.item())
    assert (pi * kl_k3(pi.log(), ref.log())).sum().item() == pytest.approx(kl.item())


def _verl_k3(logprob, ref_logprob):
    """verl 0.9.1 core_algos.kl_penalty_forward(logprob, ref_logprob, "low_var_kl"), restated."""
    kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)


def test_k3_is_bounded_like_verl_value_and_gradient():
    """Log-ratios d = logp_ref - logp on both sides of verl's bound (k3 = 10 at d = 2.61 and
    d = -11.0) and of the +-20 clamp: sparrow's k3 equals verl's to the bit, and so does its
    gradient, which is 0 past the bound (unbounded, d = 30 read e^20 - 21 = 4.85e8)."""
    d = torch.tensor([-30.0, -11.5, -10.9, -5.0, -1.0, -1e-3, 0.0, 0.5, 2.6, 2.62, 5.0, 25.0, 30.0])
    ref = torch.full_like(d, -2.0, dtype=torch.float64)
    ours = (ref - d.double()).requires_grad_(True)
    theirs = ours.detach().clone().requires_grad_(True)
    k3_ours, k3_verl = kl_k3_bounded(ours, ref), _verl_k3(theirs, ref)
    assert torch.equal(k3_ours, k3_verl)
    assert k3_ours.max().item() == 10.0 and k3_ours[-1].item() == 10.0
    k3_ours.sum().backward()
    k3_verl.sum().backward()
    assert torch.equal(ours.grad, theirs.grad)
    past = (d > 2.611) | (d < -11.0)
    assert ours.grad[past].abs().max().item() == 0.0
    assert (ours.grad[~past & (d != 0)] != 0).all()
    # Through the loss: the KL term of a 2-token step with d = 30 on one token.
    logp = torch.tensor([[-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    ref_lp = torch.tensor([[-1.0 + 30.0, -1.0 + 0.5]], dtype=torch.float64)
    loss_fn = PolicyLoss(LossConfig(kl_coef=1.0, kl_estimator="k3"), NO_CORRECTION)
    zero = torch.zeros(1, 2, dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, m = loss_fn(logp, logp.detach(), logp.detach(), zero, mask, 2, ref_logprobs=ref_lp)
    want = float(_verl_k3(logp.detach(), ref_lp).sum()) / 2  # verl agg_loss token-mean
    assert m["kl_ref"].item() == want == pytest.approx((10.0 + math.exp(0.5) - 1.5) / 2)
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0 and logp.grad[0, 1].item() != 0.0


def test_kl_term_added_with_coefficient_and_requires_ref():
    logp, old, rollout, adv, mask = _inputs()
    ref = old - 0.5
    base, _ = PolicyLoss(LossConfig(), NO_CORRECTION)(logp, old, rollout, adv, mask, 5)
    loss_fn = PolicyLoss(LossConfig(kl_coef=0.1, kl_estimator="k1"), NO_CORRECTION)
    assert loss_fn.needs_ref
    loss, m = loss_fn(logp, old, rollout, adv, mask, 5, ref_logprobs=ref)
    k1 = (logp - ref).mean().item()
    assert m["kl_ref"].item() == pytest.approx(k1)
    assert loss.item() == pytest.approx(base.item() + 0.1 * k1)
    with pytest.raises(ValueError, match="ref_logprobs"):
        loss_fn(logp, old, rollout, adv, mask, 5)


def test_masked_tokens_do_not_count_and_nan_safe():
    logp, old, rollout, adv, mask = _inputs()
    mask[0, 0] = False
    rollout = rollout.clone()
    rollout[0, 0] = -math.inf  # garbage off the completion must not leak
    loss, m = PolicyLoss(LossConfig())(logp, old, rollout, adv, mask, 4)
    assert loss.item() == pytest.approx(sum(TOKEN_LOSS[1:]) / 4)
    assert m["clip_frac_high"].item() == 0.0
    assert math.isfinite(m["correction/weight_max"].item())


def test_entropy():
    logp_full, old, rollout, adv, mask = _inputs()
    ent = torch.full((1, 5), 2.0)
    _, m = PolicyLoss(LossConfig())(logp_full, old, rollout, adv, mask, 10, entropy=ent)
    assert m["entropy"].item() == pytest.approx(1.0)  # 5 tokens x 2.0 / 10 global tokens
