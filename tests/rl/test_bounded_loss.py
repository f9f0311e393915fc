"""The policy loss is bounded by default: the dual clip (c = 3) is on unless switched off.

A batch where 1% of the negative-advantage tokens have a ratio near e^20 (a sparse rollout token
the dense policy finds far likelier than the engine did, or a stale log-prob) must not own the
step: unclipped, the PPO loss of those tokens grows with the ratio (millions); with the dual clip
each is capped at -c * A.
"""

import torch

from sparrow.rl.losses import LossConfig, PolicyLoss


def _batch(num_tokens: int = 10_000, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    advantages = torch.where(torch.rand(1, num_tokens, generator=gen) < 0.5, -1.0, 1.0)  # (1, T)
    old = -torch.rand(1, num_tokens, generator=gen) * 3  # (1, T)
    logprobs = old.clone()
    negative = (advantages[0] < 0).nonzero().flatten()
    outliers = negative[: len(negative) // 100]  # 1% of the A < 0 tokens
    logprobs[0, outliers] = old[0, outliers] + 19.9  # ratio ~ e^20
    mask = torch.ones(1, num_tokens, dtype=torch.bool)
    return logprobs, old, old.clone(), advantages, mask, float(num_tokens)


def test_default_loss_is_bounded_where_the_unclipped_one_explodes():
    batch = _batch()
    default, metrics = PolicyLoss(LossConfig())(*batch)
    unclipped, _ = PolicyLoss(LossConfig(dual_clip=None))(*batch)
    assert LossConfig().dual_clip == 3.0
    assert unclipped.item() > 1e6
    assert abs(default.item()) < 0.1  # each outlier adds at most c * |A| / T
    assert metrics["dual_clip_frac"].item() > 0
