"""Completions that hit the length limit: DAPO's soft overlong punishment and overlong filtering
(arXiv 2503.14476, §3.4; verl 0.9.1's `reward_model.overlong_buffer`).

A completion cut at the limit has no answer yet, so its reward of 0 says "wrong" about a chain
of thought that may have been going right: noise in the reward. DAPO offers two remedies:
- the soft punishment (`buffer` > 0): with L = rollout.max_new_tokens and a buffer of B tokens,
  a completion of n tokens gets `penalty_factor` x min(0, (L - B - n) / B) added to its reward:
  0 up to L - B tokens, then falling linearly to -penalty_factor at L (verl's formula; DAPO's
  -1 beyond L cannot happen when generation stops at L);
- filtering (`mask_truncated`): the loss leaves out every completion that stopped for length
  (finish reason "length"), its tokens out of the token count too.
Both off by default.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from sparrow.distributed import Ranks
from sparrow.rl.batch import RolloutBatch


@dataclass
class OverlongConfig:
    buffer: int = 0  # B: the last B tokens before rollout.max_new_tokens are penalised; 0: off
    penalty_factor: float = 1.0  # the penalty at the limit
    mask_truncated: bool = False  # leave completions cut by the limit out of the loss

    def __post_init__(self):
        if self.buffer < 0 or self.penalty_factor < 0:
            raise ValueError(
                "rl.overlong needs buffer >= 0 and penalty_factor >= 0, got "
                f"buffer={self.buffer}, penalty_factor={self.penalty_factor}"
            )


def overlong_penalty(lengths: Tensor, max_new_tokens: int, cfg: OverlongConfig) -> Tensor:
    """(N,) the reward added to each completion of `lengths` (N,) tokens; zeros when off."""
    if cfg.buffer == 0:
        return torch.zeros(lengths.shape, dtype=torch.float32)
    expected = max_new_tokens - cfg.buffer
    excess = (lengths.float() - expected) / cfg.buffer  # (N,)
    return -excess.clamp(min=0) * cfg.penalty_factor


def truncated_rows(finish_reasons: list[str]) -> Tensor:
    """(N,) bool: the completions that stopped at the length limit."""
    return torch.tensor([r == "length" for r in finish_reasons], dtype=torch.bool)


def overlong_shaping(
    scores: Tensor, batch: RolloutBatch, max_new_tokens: int, cfg: OverlongConfig, ranks: Ranks
) -> tuple[Tensor, dict]:
    """The rewards the advantages see (the task's `scores` (B,) plus the soft penalty) and
    {"masked": (B,) bool rows the loss leaves out or None, "metrics": overlong/* over all
    ranks}."""
    truncated = truncated_rows(batch.finish_reasons)  # (B,)
    lengths = batch.completion_mask.sum(-1)  # (B,)
    penalty = overlong_penalty(lengths, max_new_tokens, cfg)  # (B,)
    metrics = {}
    if cfg.buffer or cfg.mask_truncated:
        n = len(batch)
        metrics = {
            "overlong/penalty_mean": ranks.mean(float(penalty.sum()), n),
            "overlong/truncated_frac": ranks.mean(float(truncated.sum()), n),
        }
    masked = truncated if cfg.mask_truncated else None
    return scores + penalty, {"masked": masked, "metrics": metrics}
