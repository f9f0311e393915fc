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
    """The speculative sampling rule for one sequence (`accept_rounds` with one sequence).

    draft_probs (k, V): q at each drafted position; target_probs (k + 1, V): p at the same
    positions and one more; draft_tokens: the k tokens drawn from q; accept_uniforms (k,):
    U[0, 1) draws, one per draft; draw(weights (V,)) -> a token drawn from the (unnormalised)
    weights. Token i is accepted when u_i * q_i(x_i) < p_i(x_i), i.e. with prob min(1, p/q).
    """
    k = len(draft_tokens)
    assert draft_probs.shape[0] == k and target_probs.shape[0] == k + 1, "k drafts, k + 1 targets"

    def draw_rows(weights: Tensor) -> Tensor:  # (1, V) -> (1,)
        return torch.tensor([draw(weights[0])])

    return accept_rounds(draft_probs, target_probs, [draft_tokens], accept_uniforms, draw_rows)[0]


def accept_rounds(
    draft_probs: Tensor,
    target_probs: Tensor,
    draft_tokens: list[list[int]],
    accept_uniforms: Tensor,
    draw_rows: Callable[[Tensor], Tensor],
) -> list[Verdict]:
    """The rule for a round of S sequences at once: two host reads in all, not a few per
    sequence (each a device sync on a GPU).

    draft_tokens[s]: sequence s's k_s drafts (k_s >= 0); draft_probs (sum k_s, V) and
    accept_uniforms (sum k_s,) in that order; target_probs (sum (k_s + 1), V): p at each
    sequence's drafted positions and one more; draw_rows(weights (S, V)) -> (S,) one token per
    row of (unnormalised) weights: sequence s's residual max(0, p_j - q_j) at its first rejected
    draft j, or its bonus row p_k when all k_s stand (p_j itself where the residual is all zero:
    p == q at j, a rejection of probability 0 met through rounding).
    """
    device = target_probs.device
    flat = [t for tokens in draft_tokens for t in tokens]
    firsts: list[int] = []  # each sequence's first draft
    target_rows: list[int] = []  # each sequence's target rows, in order
    for tokens in draft_tokens:
        firsts.append(len(target_rows) - len(firsts))
        target_rows += range(len(target_rows), len(target_rows) + len(tokens) + 1)
    # Each draft's target row: its sequence's rows without the last (the bonus position).
    drafted_rows = [r for s, tokens in enumerate(draft_tokens) for r in
                    range(firsts[s] + s, firsts[s] + s + len(tokens))]  # fmt: skip
    rejected: list[bool] = []
    if flat:
        ids = torch.tensor(flat, device=device)[:, None]  # (D, 1)
        q = draft_probs.gather(1, ids)[:, 0]  # (D,)
        p = target_probs[torch.tensor(drafted_rows, device=device)].gather(1, ids)[:, 0]  # (D,)
        rejected = (accept_uniforms * q >= p).tolist()  # q > 0 for a drawn token
    accepted, at_target, at_draft = [], [], []
    for s, tokens in enumerate(draft_tokens):
        verdicts = rejected[firsts[s] : firsts[s] + len(tokens)]
        j = verdicts.index(True) if True in verdicts else len(tokens)
        accepted.append(j)
        at_target.append(firsts[s] + s + j)  # p_j: the residual's or the bonus row
        at_draft.append(firsts[s] + j if j < len(tokens) else -1)  # q_j, or none (bonus)
    weights = target_probs[torch.tensor(at_target, device=device)]  # (S, V)
    if any(d >= 0 for d in at_draft):
        draft = torch.tensor([max(d, 0) for d in at_draft], device=device)
        subtract = torch.tensor([d >= 0 for d in at_draft], device=device)[:, None]  # (S, 1)
        residual = (weights - draft_probs[draft]).clamp_(min=0.0)  # (S, V)
        usable = subtract & (residual.sum(-1, keepdim=True) > 0.0)  # (S, 1)
        weights = torch.where(usable, residual, weights)
    tokens = draw_rows(weights).tolist()  # (S,)
    return [Verdict(j, int(t)) for j, t in zip(accepted, tokens, strict=True)]


def draft_acceptance(draft_probs: Tensor, target_probs: Tensor) -> Tensor:
    """(n,) sum_v min(p(v), q(v)) at n drafted positions, draft_probs q and target_probs p
    (n, V) the processed distributions the rule compares: each draft's acceptance probability
    (1 - TV(p, q)), the quantity E[tokens per round] = (1 - a^(k+1)) / (1 - a) is built on.
    Clamped at 1: two equal fp32 distributions sum to 1 + rounding."""
    return torch.minimum(draft_probs, target_probs).sum(-1).clamp_(max=1.0)  # (n,)
