"""How far the rollout policy's log-probs are from the dense policy's on the step's own tokens,
in the terms peers log as "rollout correction" metrics (verl's rollout_corr, SkyRL, TRL), beside
the acceptance: per position bin and for the step.

On tokens drawn from the rollout policy q (full vocabulary: the policies are compared, not the
top-p draws), with p the dense policy before the update and d = log p - log q per token:
- k1 = E[-d] and k3 = E[min(e^d - 1 - d, 10)] (Schulman's estimators of KL(q || p); k3 >= 0
  per token, bounded like the KL loss's k3, sparrow/rl/losses.py `kl_k3_bounded`: one token
  with a log-ratio of 30 adds 10, not e^20; verl's own metric, rollout_corr/k3_kl, is unbounded);
- ppl_ratio: the dense policy's perplexity over the rollout's, per sequence, averaged over
  sequences: exp(mean_t(-d)) (> 1: the dense policy finds the rollout's tokens less likely);
- ratio_max / ratio_min: the extreme token ratio e^d before any correction truncates it.
Rows rolled out densely (the noise floor) are left out: they measure the same policy twice.
Ranks pool their tokens first, so every rank logs the same figures.
"""

import math

import torch
from torch import Tensor

from sparrow.control.acceptance import flatten_completion
from sparrow.distributed import Ranks
from sparrow.rl.losses import K3_MAX
from sparrow.rl.rollout_correction import MAX_LOG_RATIO


def mismatch_metrics(
    rollout_logprobs: Tensor,
    dense_logprobs: Tensor,
    mask: Tensor,
    bin_tokens: int,
    ranks: Ranks,
) -> dict[str, float]:
    """`mismatch/...` metrics of (B, T) aligned log-probs over the (B, T) bool `mask`."""
    d = (dense_logprobs - rollout_logprobs).double().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    d = torch.where(mask, d, 0.0)  # (B, T)
    tokens = mask.sum(-1)  # (B,)
    rows = tokens > 0
    seq_ppl = torch.exp(-d.sum(-1)[rows] / tokens[rows])  # (b,)
    values, positions = flatten_completion(d, mask)  # (N,)
    values, positions = ranks.gather_tokens(values, positions)
    seq_ppl, _ = ranks.gather_tokens(seq_ppl, seq_ppl.new_zeros(len(seq_ppl), dtype=torch.long))
    if len(values) == 0:
        return {}
    # The KL loss's bound; (e^d - 1) - d in the order this metric always summed (same bits).
    k1, k3 = -values, (values.exp() - 1 - values).clamp(max=K3_MAX)  # (N,)
    metrics = {
        "mismatch/k1": float(k1.mean()),
        "mismatch/k3": float(k3.mean()),
        "mismatch/ppl_ratio": float(seq_ppl.mean()),
        "mismatch/ratio_max": math.exp(float(values.max())),
        "mismatch/ratio_min": math.exp(float(values.min())),
    }
    bins = positions // bin_tokens
    for b in bins.unique().tolist():
        in_bin = bins == b
        metrics[f"mismatch/k1/bin{b}"] = float(k1[in_bin].mean())
        metrics[f"mismatch/k3/bin{b}"] = float(k3[in_bin].mean())
    return metrics
