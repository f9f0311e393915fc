"""Rollout correction: how much each token's loss counts, given that the token was sampled by the
rollout engine (sparse, and numerically different) and not by the dense policy being trained.

Per completion token, the log-ratio d = logp_old - logp_rollout (old: the dense policy before the
update). Each mode turns d into a detached weight w >= 0 that multiplies the token's PPO loss;
one pure function per mode, chosen once by `make_correction`:

- `tis` (default): w = min(e^d, cap). Today's sparrow; equal to verl 0.9.1 `rollout_is="token"`,
  TRL 1.16 `token_truncate` (clip_min None), SkyRL 0.3.0 `tis_ratio_type="token"`.
- `token_mask` (IcePop, arXiv 2510.18855; "masked IS"): w = e^d if lo <= e^d <= hi, else 0.
  Equal to OpenRLHF 0.11.2 `is_correction_level=token, is_correction_mode=mask` (its default
  band [0.5, 5]), verl 0.9.1 `rollout_is="token", rollout_is_threshold="lo_hi"`, TRL 1.16
  `token_mask`.
- `seq_tis`: w = min(e^S, cap) on every token of a sequence, S = the sum of d over its completion
  tokens (the product of its ratios). Equal to verl 0.9.1 `rollout_is="sequence"`, SkyRL 0.3.0
  `tis_ratio_type="sequence"`, TRL 1.16 `sequence_truncate`.
- `seq_mask` (geometric rejection): a sequence whose geometric-mean ratio e^m is outside
  [lo, hi] is rejected, m the mean of d over its completion tokens, each d clamped first (below):
  its tokens leave the loss mask, so they count neither in the step's token count (the
  token_mean denominator), nor among its sequences (as overlong-masked rows; verl's seq-mean
  modes divide by the mini-batch's rows, rejected ones included), nor in the KL term; kept
  sequences get w = 1. Equal to verl 0.9.1 `rollout_rs="seq_mean_k1"`, whose rejection edits the
  response mask the whole update reads (rollout_corr_helper.compute_rollout_correction_and_add_
  to_batch); verl bounds its k1 statistic -m, so sparrow's [lo, hi] is verl's threshold
  "1/hi_1/lo" (the same band when lo = 1/hi). Equal to SkyRL 0.3.0
  `sequence_mask_metric="geometric"` except on rows holding a token with |d| > MAX_LOG_RATIO
  (SkyRL clamps after the mean). The step's counts are taken before the update, so the caller
  removes the rejected tokens first (`make_rejection`; train/policy_update.py).
- `none`: w = 1.

Peers that differ (so sparrow's mode is not theirs): OpenRLHF's `seq` mask keeps each surviving
token's e^d as its weight; TRL's `sequence_mask` masks the product e^S, not the geometric mean,
and weights survivors by e^S. Per-token log-ratios are clamped to +-MAX_LOG_RATIO before exp and
before seq_mask's mean (as verl does, its SAFETY_BOUND), seq_tis's sums after summing (verl,
SkyRL); TRL clamps neither, so below e^-20 it keeps e^d where sparrow, verl and SkyRL keep e^-20.
SkyRL's geometric mask clamps the mean, not the tokens: a token of d = 25 counts as 25 there and
as 20 in verl and sparrow, so SkyRL rejects some rows the other two keep. Sparrow follows verl,
whose mode this is, and reads every per-token log-ratio clamped alike; the price is that one
runaway token (even d = -inf) weighs at most MAX_LOG_RATIO / n in the row's mean, so a long row
whose other tokens lean the other way is kept.

The weight changes the measure, not the objective: it is computed without gradient, so the
gradient flows through the current log-probs alone (verl's rollout_corr_math.md §3.2.2).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

# Log-ratios are clamped before exp, as verl does, so a stray -inf log-prob cannot make inf * 0.
MAX_LOG_RATIO = 20.0
CORRECTION_MODES = ("tis", "token_mask", "seq_tis", "seq_mask", "none")
REJECTING_MODES = ("seq_mask",)  # modes whose Correction.rejected is not always empty


@dataclass
class CorrectionConfig:
    mode: str = "tis"  # one of CORRECTION_MODES (the list above)
    cap: float = 2.0  # C of tis and seq_tis: weights above C are truncated to C (Sparrow: 2-3)
    lo: float = 0.5  # token_mask / seq_mask keep ratios in [lo, hi] (OpenRLHF's default band)
    hi: float = 5.0  # upper end of that band

    def __post_init__(self):
        if self.mode not in CORRECTION_MODES:
            raise ValueError(
                f"rl.correction.mode={self.mode!r}: expected one of {CORRECTION_MODES}"
            )
        if self.cap <= 0 or not 0 <= self.lo <= self.hi:
            raise ValueError(
                "rl.correction needs cap > 0 and 0 <= lo <= hi, got "
                f"cap={self.cap}, lo={self.lo}, hi={self.hi}"
            )


@dataclass
class Correction:
    weight: Tensor  # (B, T) detached, multiplies the token's loss
    truncated: Tensor  # (B, T) bool, tokens whose weight was cut down to the cap
    masked: Tensor  # (B, T) bool, tokens whose loss the correction zeroed
    # (B, T) bool, tokens of rejected rows: out of the loss mask (its counts and the KL term too)
    rejected: Tensor


CorrectionFn = Callable[[Tensor, Tensor, Tensor], Correction]


def _token_log_ratio(old_logprobs: Tensor, rollout_logprobs: Tensor) -> Tensor:
    """d = logp_old - logp_rollout, detached and clamped. (B, T) -> (B, T)."""
    return (old_logprobs - rollout_logprobs).detach().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def _sequence_log_ratio(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> Tensor:
    """S = sum of d over each row's completion tokens, detached (off-mask garbage, e.g. -inf
    padding log-probs, never enters). (B, T) -> (B, 1)."""
    d = torch.where(mask, old_logprobs.detach() - rollout_logprobs.detach(), 0.0)  # (B, T)
    return d.sum(-1, keepdim=True)


def _nothing(mask: Tensor) -> Tensor:
    return torch.zeros_like(mask)


def token_tis(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, cap: float):
    """Token-level truncated IS: w = min(e^d, cap).

    Args:
        old_logprobs, rollout_logprobs: (B, T). mask: (B, T) bool, completion tokens.
    Returns:
        Correction; truncated where e^d > cap.
    """
    ratio = torch.exp(_token_log_ratio(old_logprobs, rollout_logprobs))  # (B, T)
    return Correction(ratio.clamp(max=cap), ratio > cap, _nothing(mask), _nothing(mask))


def token_mask(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, lo: float, hi: float):
    """IcePop / masked IS: w = e^d where lo <= e^d <= hi, else 0 (the token's loss is dropped).

    Args:
        old_logprobs, rollout_logprobs: (B, T). mask: (B, T) bool, completion tokens.
    Returns:
        Correction; masked where e^d is outside [lo, hi].
    """
    ratio = torch.exp(_token_log_ratio(old_logprobs, rollout_logprobs))  # (B, T)
    keep = (ratio >= lo) & (ratio <= hi)  # (B, T)
    return Correction(torch.where(keep, ratio, 0.0), _nothing(mask), ~keep, _nothing(mask))


def sequence_tis(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, cap: float):
    """Sequence-level truncated IS: every token of a row gets min(e^S, cap), S the row's summed
    log-ratio (the product of its token ratios).

    Args:
        old_logprobs, rollout_logprobs: (B, T). mask: (B, T) bool, completion tokens.
    Returns:
        Correction; truncated on every token of a row whose e^S > cap.
    """
    log_s = _sequence_log_ratio(old_logprobs, rollout_logprobs, mask)  # (B, 1)
    ratio = torch.exp(log_s.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))  # (B, 1)
    weight = ratio.clamp(max=cap).expand_as(mask)  # (B, T)
    return Correction(weight, (ratio > cap).expand_as(mask), _nothing(mask), _nothing(mask))


def sequence_mask(
    old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, lo: float, hi: float
):
    """Geometric sequence rejection: a row is rejected (w = 0 and out of the loss mask on all its
    tokens) when its geometric-mean ratio e^m is outside [lo, hi], m the mean of its completion
    tokens' log-ratios, each clamped to +-MAX_LOG_RATIO first (verl's seq_mean_k1; compared in
    log space, as verl does); kept rows get w = 1. A row the mask already cut has no token left
    to reject, so applying the rejection twice (to the step's mask, then per micro-batch)
    rejects nothing more.

    Args:
        old_logprobs, rollout_logprobs: (B, T). mask: (B, T) bool, completion tokens.
    Returns:
        Correction; masked and rejected on every token of a rejected row.
    """
    d = torch.where(mask, _token_log_ratio(old_logprobs, rollout_logprobs), 0.0)  # (B, T)
    num_tokens = mask.sum(-1, keepdim=True).clamp(min=1)  # (B, 1)
    log_geo = d.sum(-1, keepdim=True) / num_tokens  # (B, 1), within +-MAX_LOG_RATIO
    log_lo = math.log(lo) if lo > 0 else -math.inf
    keep = ((log_geo >= log_lo) & (log_geo <= math.log(hi))).expand_as(mask)  # (B, T)
    return Correction(keep.to(old_logprobs.dtype), _nothing(mask), ~keep, ~keep)


def no_correction(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor):
    """w = 1: the tokens are trained as if the dense policy had sampled them. (B, T)."""
    return Correction(torch.ones_like(old_logprobs), _nothing(mask), _nothing(mask), _nothing(mask))


def make_correction(cfg: CorrectionConfig) -> CorrectionFn:
    """The mode's function, (old_logprobs, rollout_logprobs, mask) (B, T) each -> Correction."""
    modes: dict[str, CorrectionFn] = {
        "tis": partial(token_tis, cap=cfg.cap),
        "token_mask": partial(token_mask, lo=cfg.lo, hi=cfg.hi),
        "seq_tis": partial(sequence_tis, cap=cfg.cap),
        "seq_mask": partial(sequence_mask, lo=cfg.lo, hi=cfg.hi),
        "none": no_correction,
    }
    return modes[cfg.mode]


def make_rejection(cfg: CorrectionConfig) -> Callable[[Tensor, Tensor, Tensor], Tensor] | None:
    """For a mode that rejects rows (REJECTING_MODES), the function (old_logprobs,
    rollout_logprobs, mask) (B, T) each -> (B, T) bool, the tokens of `mask` it rejects; None for
    the modes that only weight tokens. The step's counts are taken without these tokens."""
    if cfg.mode not in REJECTING_MODES:
        return None
    correction = make_correction(cfg)
    return lambda old, rollout, mask: correction(old, rollout, mask).rejected & mask
