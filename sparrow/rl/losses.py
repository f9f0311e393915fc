"""GRPO policy loss: PPO clip (clip-higher, optional dual clip) x rollout correction.

Pure tensor functions in the style of verl's `core_algos`, and `PolicyLoss`, which picks the
variants once from a `LossConfig` and a `CorrectionConfig`. Three policies appear per token:
- rollout: the sparse engine that sampled the token (`rollout_logprobs`),
- old: the dense policy before this step's update (`old_logprobs`, no grad),
- current: the dense policy being trained (`logprobs`, with grad).

Per token: ratio r = exp(logp - logp_old); PPO loss max(-A r, -A clip(r, 1 - eps_low,
1 + eps_high)) with clip-higher (DAPO, arXiv 2503.14476); the dual clip (default c = 3,
`dual_clip=null` turns it off) bounds the loss of A < 0 tokens at -c A (arXiv 1912.09729);
times the rollout correction's detached weight, which corrects for sampling from the sparse
engine rather than from the dense policy: by default the truncated importance sampling weight
min(exp(logp_old - logp_rollout), C) (Sparrow §RL recipe; Yao et al., "Your efficient RL
framework secretly brings you off-policy RL training"); the other modes are in
sparrow/rl/rollout_correction.py, where `seq_mask` rejects rows instead: as in verl, they leave
the loss mask, and the step's counts, which the caller takes after the rejection. With
kl_coef > 0, kl_coef x the KL to a frozen reference policy (the initial weights,
sparrow/rl/reference.py) is added, estimated per token by k1 or k3 (Schulman's "Approximating KL
divergence"; k3 bounded at 10 per token as verl bounds it) and aggregated like the policy loss.

Aggregation (`aggregation`, verl's `loss_agg_mode`) turns the per-token losses of the step into one
number, always with *global* denominators, so that summing the micro-batch losses (and
all-reducing across ranks) gives the same loss and gradient for any split of the batch (a row is
never split):
- `token_mean` (default; DAPO): sum over every completion token / the step's token count N.
- `seq_mean_token_mean` (the original GRPO): the mean over the step's S sequences of each
  sequence's token mean; verl 0.9.1 `seq-mean-token-mean` on one micro-batch.
- `seq_mean_token_sum_norm` (Dr. GRPO, arXiv 2503.20783): each sequence's token *sum* over a
  constant L (rollout.max_new_tokens), averaged over the S sequences, so a long answer is not
  down-weighted per token. verl 0.9.1's `seq-mean-token-sum-norm` sums over sequences and divides
  by the padded width instead, a divisor that changes with the micro-batch.
The logged metrics stay token means whatever the aggregation.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from sparrow.rl.rollout_correction import (
    MAX_LOG_RATIO,
    Correction,
    CorrectionConfig,
    make_correction,
)

# verl's bound on a token's k3 (its lower bound, -10, cannot bind: k3 >= 0).
K3_MAX = 10.0

# How the trainer reduces each metric over micro-batches and ranks. "sum" metrics are already
# divided by the global token count, so their sum is the step's token mean.
METRIC_REDUCTIONS = {
    "pg_loss": "sum",
    "clip_frac_low": "sum",
    "clip_frac_high": "sum",
    "dual_clip_frac": "sum",
    "correction/weight_mean": "sum",
    "correction/weight_min": "min",
    "correction/weight_max": "max",
    "correction/truncated_frac": "sum",
    "correction/masked_frac": "sum",
    "approx_kl": "sum",
    "kl_ref": "sum",
    "entropy": "sum",
}


@dataclass
class LossConfig:
    clip_low: float = 0.2  # ratio lower bound is 1 - clip_low
    clip_high: float = 0.28  # ratio upper bound is 1 + clip_high (clip-higher)
    # c > 1 caps the loss of A < 0 tokens at -c * A; None: off. On by default (c = 3, the
    # paper's and verl's value): one token with a huge ratio would otherwise own the step.
    dual_clip: float | None = 3.0
    kl_coef: float = 0.0  # weight of the KL-to-reference term; 0: off (no reference pass needed)
    # "k1" (logp - logp_ref) | "k3" (min(exp(d) - d - 1, 10), d = logp_ref - logp; verl's bound)
    kl_estimator: str = "k3"
    aggregation: str = "token_mean"  # one of AGGREGATIONS (the module docstring)

    def __post_init__(self):
        if self.kl_estimator not in ("k1", "k3"):
            raise ValueError(
                f"rl.loss.kl_estimator={self.kl_estimator!r}: expected one of ('k1', 'k3')"
            )
        if self.kl_coef < 0:
            raise ValueError(f"rl.loss.kl_coef must be >= 0, got {self.kl_coef}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"rl.loss.aggregation={self.aggregation!r}: expected one of {AGGREGATIONS}"
            )


AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def ppo_clip_token_loss(
    log_ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric PPO clipped surrogate per token.

    Args:
        log_ratio: (B, T) logp - logp_old. advantages: (B, T).
    Returns:
        loss (B, T); clipped_low (B, T) bool where r < 1 - clip_low binds (A < 0);
        clipped_high (B, T) bool where r > 1 + clip_high binds (A > 0).
    """
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))  # (B, T)
    unclipped = -advantages * ratio  # (B, T)
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # (B, T)
    loss = torch.maximum(unclipped, clipped)  # (B, T)
    clipped_low = (ratio < 1.0 - clip_low) & (advantages < 0)  # (B, T)
    clipped_high = (ratio > 1.0 + clip_high) & (advantages > 0)  # (B, T)
    return loss, clipped_low, clipped_high


def dual_clip_token_loss(loss: Tensor, advantages: Tensor, clip_c: float) -> tuple[Tensor, Tensor]:
    """Dual clip: for A < 0 the PPO loss grows without bound in r; cap it at -c * A.

    Args:
        loss: (B, T) PPO clipped loss. advantages: (B, T). clip_c: c > 1.
    Returns:
        loss (B, T); dual_clipped (B, T) bool where the cap binds.
    """
    cap = -advantages * clip_c  # (B, T)
    dual_clipped = (advantages < 0) & (loss > cap)  # (B, T)
    return torch.where(dual_clipped, cap, loss), dual_clipped


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k1 estimator of KL(pi || ref) on tokens sampled from pi: logp - logp_ref. (B, T)."""
    return logprobs - ref_logprobs


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """k3 estimator of KL(pi || ref): exp(d) - d - 1 with d = logp_ref - logp; >= 0. (B, T).
    Unbounded: DistillSparse's term and the approx_kl metric; the KL loss bounds it."""
    d = (ref_logprobs - logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # (B, T)
    return torch.exp(d) - d - 1.0


def kl_k3_bounded(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """The KL loss's k3: `kl_k3` at most K3_MAX per token, as verl 0.9.1 bounds it
    (core_algos.kl_penalty_forward, "k3"/"low_var_kl"). A token past the bound (d > 2.61 or
    d < -11.0) adds K3_MAX and no gradient, so one token with a log-ratio of 30 cannot add e^20
    to the step's KL. (B, T)."""
    return kl_k3(logprobs, ref_logprobs).clamp(max=K3_MAX)


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": kl_k1,
    "k3": kl_k3_bounded,
}


def global_token_mean(values: Tensor, mask: Tensor, global_num_tokens: float | Tensor) -> Tensor:
    """sum(values over mask) / global_num_tokens: this micro-batch's share of the step mean.

    Args:
        values: (B, T). mask: (B, T) bool. global_num_tokens: completion tokens of the whole step.
    Returns:
        () scalar.
    """
    return torch.where(mask, values, torch.zeros_like(values)).sum() / global_num_tokens


@dataclass(frozen=True)
class StepCounts:
    """The whole step's denominators (over all micro-batches and ranks)."""

    tokens: float | Tensor  # completion tokens N
    sequences: float | Tensor = 1.0  # sequences S (rows with completion tokens)
    norm_length: int = 1  # Dr. GRPO's constant L (rollout.max_new_tokens)


def aggregate(values: Tensor, mask: Tensor, mode: str, step: StepCounts) -> Tensor:
    """This micro-batch's share of the step's aggregated loss (module docstring).

    Args:
        values: (B, T) per-token losses. mask: (B, T) bool, completion tokens.
    Returns:
        () scalar; the micro-batch shares add up to the step's value.
    """
    masked = torch.where(mask, values, torch.zeros_like(values))  # (B, T)
    if mode == "token_mean":
        return masked.sum() / step.tokens
    row_sums = masked.sum(-1)  # (B,)
    if mode == "seq_mean_token_mean":
        return (row_sums / mask.sum(-1).clamp(min=1)).sum() / step.sequences
    return row_sums.sum() / (step.sequences * step.norm_length)  # seq_mean_token_sum_norm


class PolicyLoss:
    """The GRPO loss with its variants (dual clip, rollout correction, KL estimator) fixed at
    construction."""

    def __init__(self, cfg: LossConfig, correction: CorrectionConfig | None = None):
        if cfg.dual_clip is not None and cfg.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or None for off), got {cfg.dual_clip}")
        if cfg.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"kl_estimator must be one of {sorted(KL_ESTIMATORS)}")
        self.cfg = cfg
        self._dual_clip = (
            None if cfg.dual_clip is None else partial(dual_clip_token_loss, clip_c=cfg.dual_clip)
        )
        self._correction = make_correction(correction or CorrectionConfig())
        self._kl = KL_ESTIMATORS[cfg.kl_estimator] if cfg.kl_coef != 0 else None

    @property
    def needs_ref(self) -> bool:
        """Whether the trainer must pass reference log-probs."""
        return self._kl is not None

    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        rollout_logprobs: Tensor,
        advantages: Tensor,
        loss_mask: Tensor,
        global_num_tokens: float | Tensor,
        ref_logprobs: Tensor | None = None,
        entropy: Tensor | None = None,
        step: StepCounts | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Loss of one micro-batch, normalised by the step's global token count.

        Args:
            logprobs: (B, T) current dense log-probs of the sampled tokens (with grad).
            old_logprobs: (B, T) dense log-probs before the update (no grad).
            rollout_logprobs: (B, T) the rollout engine's log-probs of the same tokens.
            advantages: (B, T) per-token advantages.
            loss_mask: (B, T) bool, completion tokens. Rows the correction rejects (seq_mask)
                leave it here, for the policy and the KL terms alike.
            global_num_tokens: completion tokens of the step over all micro-batches and ranks,
                those of rejected rows left out (rollout_correction.make_rejection). Pass the
                true global count: sparrow's DenseActor undoes DeepSpeed's averaging over ranks
                and micro-batches, so gradients add up to the step's token mean.
            ref_logprobs: (B, T) reference log-probs; required iff `needs_ref`.
            entropy: (B, T) per-token entropy to log (the actor's `LogprobOutput.entropy`), or
                None.
            step: the step's sequence count (rejected rows left out) and L, needed by the seq_*
                aggregations (their token count is `global_num_tokens`).
        Returns:
            loss: () scalar with grad. metrics: () detached tensors, keys and their reduction
            over micro-batches/ranks in METRIC_REDUCTIONS; min/max are +inf/-inf on a micro-batch
            without tokens (the identities of min/max).
        """
        cfg = self.cfg
        pg, *clipped = self._clipped_token_loss(logprobs, old_logprobs, advantages, loss_mask)
        correction = self._correction(old_logprobs, rollout_logprobs, loss_mask)
        pg = pg * correction.weight  # (B, T)
        kept = loss_mask & ~correction.rejected  # (B, T) what the policy and KL terms sum over
        step = self._step_counts(step, global_num_tokens)
        agg = partial(aggregate, mask=kept, mode=cfg.aggregation, step=step)
        pg_loss = agg(pg)
        loss = pg_loss

        metrics = {}
        if self._kl is not None:
            if ref_logprobs is None:
                raise ValueError("kl_coef != 0 needs ref_logprobs")
            kl = agg(self._kl(logprobs, ref_logprobs))
            loss = loss + cfg.kl_coef * kl
            metrics["kl_ref"] = kl.detach()
        with torch.no_grad():
            mean = partial(global_token_mean, mask=loss_mask, global_num_tokens=global_num_tokens)
            metrics["pg_loss"] = pg_loss.detach()
            metrics |= _diagnostics(mean, clipped, correction, loss_mask, old_logprobs, logprobs)
            if entropy is not None:
                metrics["entropy"] = mean(entropy.float())
        return loss, metrics

    def _step_counts(
        self, step: StepCounts | None, global_num_tokens: float | Tensor
    ) -> StepCounts:
        """The denominators the aggregation divides by: token_mean's is the token count alone;
        the seq_* aggregations need the caller's sequence count and L."""
        if self.cfg.aggregation == "token_mean":
            return StepCounts(global_num_tokens)
        if step is None:
            raise ValueError(
                f"aggregation {self.cfg.aggregation!r} needs the step's counts (step=)"
            )
        return step

    def _clipped_token_loss(
        self, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, loss_mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(pg, clipped_low, clipped_high, dual_clipped), each (B, T): PPO's clipped surrogate
        per token, dual-clipped when configured (dual_clipped all False otherwise), and where
        each clip bound."""
        log_ratio = logprobs - old_logprobs.detach()  # (B, T)
        pg, clipped_low, clipped_high = ppo_clip_token_loss(
            log_ratio, advantages, self.cfg.clip_low, self.cfg.clip_high
        )  # (B, T)
        dual_clipped = torch.zeros_like(loss_mask)  # (B, T)
        if self._dual_clip is not None:
            pg, dual_clipped = self._dual_clip(pg, advantages)
        return pg, clipped_low, clipped_high, dual_clipped


def _diagnostics(
    mean: Callable[[Tensor], Tensor],
    clipped: list[Tensor],
    correction: Correction,
    loss_mask: Tensor,
    old_logprobs: Tensor,
    logprobs: Tensor,
) -> dict[str, Tensor]:
    """The loss's detached metrics over the micro-batch's completion tokens: how often each clip
    bound and the rollout correction acted, the correction's weights, and the update's size.
    `mean` is the step's token mean; `clipped` (clipped_low, clipped_high, dual_clipped)."""
    clipped_low, clipped_high, dual_clipped = clipped
    w = correction.weight.float()
    return {
        "clip_frac_low": mean(clipped_low.float()),
        "clip_frac_high": mean(clipped_high.float()),
        "dual_clip_frac": mean(dual_clipped.float()),
        "correction/weight_mean": mean(w),
        "correction/weight_min": torch.where(loss_mask, w, torch.inf).amin(),
        "correction/weight_max": torch.where(loss_mask, w, -torch.inf).amax(),
        "correction/truncated_frac": mean(correction.truncated.float()),
        "correction/masked_frac": mean(correction.masked.float()),
        # Schulman's k3 of KL(old || current) on tokens from old: (r - 1) - log r.
        "approx_kl": mean(kl_k3(old_logprobs, logprobs.detach())),
    }
