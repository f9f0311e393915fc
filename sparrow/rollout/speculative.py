"""Lossless sparse rollouts: the sparse policy drafts, the dense policy verifies.

Speculative sampling (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023, arXiv
2302.01318) with the engine's block-sparse decode as the draft and its dense attention as the
target. Per sequence and round: k tokens are drafted by sparse decode steps, drawn from q (the
sparse policy's processed distribution: temperature, top-k, top-p), then one dense forward over
the k + 1 positions gives p at each. Draft token i is accepted with probability min(1, p_i/q_i);
the first rejected one is replaced by a draw from the normalised residual max(0, p - q), and when
all k are accepted a bonus token is drawn from p at position k + 1. Every emitted token is then
distributed exactly as dense sampling with the same settings would draw it, whatever the draft.
The acceptance probability of one drafted token is sum_v min(p(v), q(v)): the per-token
acceptance the monitor measures (sparrow/control/acceptance.py), so its bins say what a round
gains.

This file holds the rule (pure tensor functions); the engine runs the rounds
(engine.py `_speculative_round`), the model runner the dense verify pass (`ModelRunner.verify`).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class SpeculativeConfig:
    enabled: bool = (
        False  # draft with sparse decode, verify densely: samples are the dense policy's
    )
    draft_tokens: int = 4  # k: sparse tokens drafted per sequence before one dense verify pass

    def __post_init__(self):
        if self.draft_tokens < 1:
            raise ValueError(
                f"rollout.speculative.draft_tokens must be >= 1, got {self.draft_tokens}"
            )


@dataclass
class Verdict:
    """One sequence's round: how many drafts stand, and the token that follows them."""

    num_accepted: int  # j: drafts 0..j-1 are kept
    next_token: int  # the residual draw at j (j < k), or the bonus token from p at k (j == k)


def accept_drafts(
    draft_probs: Tensor,
    target_probs: Tensor,
    draft_tokens: list[int],
    accept_uniforms: Tensor,
    draw: Callable[[Tensor], int],
) -> Verdict:
    """The speculative sampling rule for one sequence.

    draft_probs (k, V): q at each drafted position; target_probs (k + 1, V): p at the same
    positions and one more; draft_tokens: the k tokens drawn from q; accept_uniforms (k,):
    U[0, 1) draws, one per draft; draw(weights (V,)) -> a token drawn from the (unnormalised)
    weights. Token i is accepted when u_i * q_i(x_i) < p_i(x_i), i.e. with prob min(1, p/q).
    """
    k = len(draft_tokens)
    assert draft_probs.shape[0] == k and target_probs.shape[0] == k + 1, "k drafts, k + 1 targets"
    if k:
        ids = torch.tensor(draft_tokens, device=draft_probs.device)[:, None]  # (k, 1)
        q = draft_probs.gather(1, ids)[:, 0]  # (k,)
        p = target_probs[:k].gather(1, ids)[:, 0]  # (k,)
        rejected = (accept_uniforms * q >= p).tolist()  # q > 0 for a drawn token
        j = rejected.index(True) if True in rejected else k
    else:
        j = 0
    if j == k:  # all accepted: the bonus token, from p after the last draft
        return Verdict(j, draw(target_probs[k]))
    residual = (target_probs[j] - draft_probs[j]).clamp_(min=0.0)  # (V,)
    if float(residual.sum()) <= 0.0:  # p == q at j: rejection had probability 0 (rounding)
        residual = target_probs[j]
    return Verdict(j, draw(residual))


def draft_acceptance(draft_probs: Tensor, target_probs: Tensor) -> Tensor:
    """(n,) sum_v min(p(v), q(v)) at n drafted positions, draft_probs q and target_probs p
    (n, V) the processed distributions the rule compares: each draft's acceptance probability
    (1 - TV(p, q)), the quantity E[tokens per round] = (1 - a^(k+1)) / (1 - a) is built on."""
    return torch.minimum(draft_probs, target_probs).sum(-1)  # (n,)
