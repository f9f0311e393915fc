"""GRPO advantages: each sample's score relative to the other samples of its prompt group.

Pure tensor functions in the style of verl's `core_algos`. Two variants, chosen once by
`make_advantage_fn`:
- `group_normalized_advantages`: (score - group mean) / (group std + eps), the GRPO paper's form
  (DeepSeekMath, arXiv 2402.03300). std is the unbiased (Bessel-corrected) sample std, as
  `torch.std` and verl compute it.
- `group_mean_advantages`: score - group mean (Dr. GRPO, arXiv 2503.20783, drops the std).

Edge cases, decided against verl 0.9.1 (core_algos.compute_grpo_outcome_advantage):
- A group of one takes verl's mean 0 and std 1: its advantage is its score / (1 + eps) (GRPO),
  or its score (Dr. GRPO), a REINFORCE term without baseline.
- A group whose scores are all equal (max == min, exact) gets advantages exactly 0 in both
  variants. verl computes (score - mean) / (std + eps) in the rewards' float32 with no such test,
  so the mean's rounding, divided by eps, leaves noise (eight rewards of 0.7: advantages 0.056
  each, all of one sign); sparrow refuses to train on it. Scores that differ, however little, are
  normalised by verl's formula (computed in float64).

    adv = make_advantage_fn(AdvantageConfig())(scores, group_ids)   # (N,)
    token_adv = broadcast_to_tokens(adv, completion_mask)           # (N, T)
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

AdvantageFn = Callable[[Tensor, Tensor], Tensor]


@dataclass
class AdvantageConfig:
    norm_by_std: bool = True  # divide by the group std (GRPO); False: mean-centre only (Dr. GRPO)
    eps: float = 1e-6  # added to the group std before dividing


def _group_stats(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-sample statistics of the sample's group.

    Args:
        scores: (N,) float, one scalar reward per sample.
        group_ids: (N,) int, samples with equal ids belong to the same prompt group.
    Returns:
        mean (N,), unbiased std (N,) (verl's 0 and 1 for a group of one), constant (N,) bool
        (all scores of a group of two or more equal), count (N,) int.
    """
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    num_groups = counts.shape[0]
    values = scores.to(torch.float64)  # (N,) exact-enough sums for any group size
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, values)  # (G,)
    mean = sums / counts  # (G,)
    centred = values - mean[inverse]  # (N,)
    sq = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, inverse, centred.square())
    std = (sq / (counts - 1).clamp(min=1)).sqrt()  # (G,) unbiased
    single = counts == 1  # (G,) verl: mean 0, std 1
    mean, std = mean.masked_fill(single, 0.0), std.masked_fill(single, 1.0)
    # max == min is exact, unlike std == 0, which rounding in the mean can miss.
    gmax = torch.full((num_groups,), -torch.inf, dtype=torch.float64)
    gmax = gmax.scatter_reduce(0, inverse, values, reduce="amax")  # (G,)
    gmin = torch.full((num_groups,), torch.inf, dtype=torch.float64)
    gmin = gmin.scatter_reduce(0, inverse, values, reduce="amin")  # (G,)
    constant = (gmax == gmin) & ~single  # (G,)
    return mean[inverse], std[inverse], constant[inverse], counts[inverse]


def group_mean_advantages(scores: Tensor, group_ids: Tensor) -> Tensor:
    """score - group mean.

    Args:
        scores: (N,) float. group_ids: (N,) int.
    Returns:
        (N,) advantages in the dtype of `scores`; 0 for constant groups, the score for a group
        of one.
    """
    mean, _, constant, _ = _group_stats(scores, group_ids)
    adv = scores.to(torch.float64) - mean  # (N,)
    return adv.masked_fill(constant, 0.0).to(scores.dtype)


def group_normalized_advantages(scores: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """(score - group mean) / (unbiased group std + eps).

    Args:
        scores: (N,) float. group_ids: (N,) int. eps: added to the std.
    Returns:
        (N,) advantages in the dtype of `scores`; 0 for constant groups, score / (1 + eps) for a
        group of one.
    """
    mean, std, constant, _ = _group_stats(scores, group_ids)
    adv = (scores.to(torch.float64) - mean) / (std + eps)  # (N,)
    return adv.masked_fill(constant, 0.0).to(scores.dtype)


def make_advantage_fn(cfg: AdvantageConfig) -> AdvantageFn:
    """The advantage variant selected by `cfg`: (scores (N,), group_ids (N,)) -> (N,)."""
    if cfg.norm_by_std:
        return partial(group_normalized_advantages, eps=cfg.eps)
    return group_mean_advantages


def broadcast_to_tokens(advantages: Tensor, completion_mask: Tensor) -> Tensor:
    """Give every completion token its sample's advantage (GRPO's outcome supervision).

    Args:
        advantages: (B,) float. completion_mask: (B, T) bool.
    Returns:
        (B, T) float, the sample's advantage on completion tokens and 0 elsewhere.
    """
    return advantages[:, None] * completion_mask.to(advantages.dtype)  # (B, T)
