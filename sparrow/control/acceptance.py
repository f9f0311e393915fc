"""Per-token acceptance of the sparse rollout policy against the dense policy, and its tail by
position.

a_t = sum_v min(p_dense(v), q_sparse(v)) = 1 - TV(p, q): the speculative-decoding acceptance
probability (Sparrow §method). Two estimators:
- `exact_acceptance`: over the full vocabulary from two log-prob tensors; a sum over the vocabulary,
  so callers that only hold logits in vocabulary chunks add up the per-chunk results.
- `topk_acceptance_bound`: the paper's estimator over the union of both sides' top-K, each side
  keeping its own top-K probs and counting ids outside its top-K as 0. Each union term is <= the
  exact term and omitted ids are >= 0, so it is a lower bound of the exact acceptance.

The tail statistic pools tokens by absolute position (prompt + generated) in bins of `bin_tokens`
and takes percentiles per bin (`bin_acceptance`); `AcceptanceMonitor` gathers a step's tokens.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

PERCENTILES = (0.01, 0.05, 0.5)  # p1, p5, p50 of BinStats


@dataclass
class MonitorConfig:
    bin_tokens: int = 2000  # width of a position bin (absolute position, prompt + generated)
    top_k: int = 20  # K of the top-K bound; read by the engine and the actor that produce top-K
    exact: bool = False  # also compute exact full-vocabulary acceptance (actor reads; costs a pass)
    exact_fraction: float = 1.0  # share of sequences measured exactly (their T x V logits kept)
    noise_floor_fraction: float = 0.0  # share of prompts rolled out densely (trainer reads)
    speedup_every: int = 0  # every N steps time a dense rollout of the same prompts; 0: never


@dataclass
class BinStats:
    bin_index: int  # position bin: tokens at absolute positions [start_token, end_token)
    start_token: int
    end_token: int
    count: int  # tokens in the bin
    mean: float
    p1: float
    p5: float
    p50: float


def exact_acceptance(p_logprobs: Tensor, q_logprobs: Tensor) -> Tensor:
    """sum_v min(p(v), q(v)) over the (possibly partial) vocabulary axis.

    Args:
        p_logprobs: (N, V) log-probs of one policy, normalised over the full vocabulary.
        q_logprobs: (N, V) the other policy, same vocabulary slice.
    Returns:
        (N,) float32 acceptance (the slice's contribution when V is a vocabulary chunk).
    """
    return torch.minimum(p_logprobs, q_logprobs).float().exp().sum(-1)  # (N,)


def topk_acceptance_bound(
    p_ids: Tensor, p_logprobs: Tensor, q_ids: Tensor, q_logprobs: Tensor, row_chunk: int = 65536
) -> Tensor:
    """The paper's top-K lower bound of the acceptance.

    An id contributes min(p, q) only when it is in both top-K lists; otherwise one side counts it
    as 0 and so does the min. Hence the sum over p's top-K ids of min(p, q where present).
    Ids are assumed unique within each row of each side (true for top-K).

    Args:
        p_ids: (N, K) int token ids of p's top-K. p_logprobs: (N, K) their log-probs.
        q_ids: (N, K2) int. q_logprobs: (N, K2).
        row_chunk: rows per chunk, bounding the (rows, K, K2) match tensor.
    Returns:
        (N,) float32 acceptance lower bound.
    """
    out = []
    for s in range(0, p_ids.shape[0], row_chunk):
        pi, pl = p_ids[s : s + row_chunk], p_logprobs[s : s + row_chunk].float()  # (n, K)
        qi, ql = q_ids[s : s + row_chunk], q_logprobs[s : s + row_chunk].float()  # (n, K2)
        match = pi[:, :, None] == qi[:, None, :]  # (n, K, K2)
        q_at_p = torch.where(match, ql[:, None, :], -torch.inf).amax(-1)  # (n, K) -inf if absent
        out.append(torch.minimum(pl, q_at_p).exp().sum(-1))  # (n,)
    if not out:
        return torch.zeros(0)
    return torch.cat(out)


def flatten_completion(values: Tensor, completion_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Completion tokens of a (B, T) per-position tensor, with their absolute positions.

    Args:
        values: (B, T). completion_mask: (B, T) bool.
    Returns:
        values (N,), positions (N,) int64, N = completion tokens.
    """
    positions = torch.arange(values.shape[1]).expand_as(values)  # (B, T)
    return values[completion_mask], positions[completion_mask]


def percentiles(values: Tensor, qs: tuple[float, ...]) -> list[float]:
    """Percentiles with linear interpolation between order statistics (numpy's and
    torch.quantile's default): the q-percentile of sorted x_0..x_{n-1} sits at index q * (n - 1).
    Sorting instead of torch.quantile avoids its 2**24-element input limit.

    Args:
        values: (n,) float, n >= 1. qs: fractions in [0, 1].
    """
    x = values.double().sort().values  # (n,)
    n = x.shape[0]
    result = []
    for q in qs:
        pos = q * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        result.append(float(x[lo] + (pos - lo) * (x[hi] - x[lo])))
    return result


def bin_acceptance(acceptance: Tensor, positions: Tensor, bin_tokens: int) -> list[BinStats]:
    """Per-position-bin count, mean, p1, p5, p50 of the acceptance.

    Args:
        acceptance: (N,) float. positions: (N,) int absolute positions. bin_tokens: bin width.
    Returns:
        one BinStats per non-empty bin, by increasing bin index.
    """
    bins = positions.long() // bin_tokens  # (N,)
    stats = []
    for b in torch.unique(bins).tolist():
        vals = acceptance[bins == b]  # (n_b,)
        p1, p5, p50 = percentiles(vals, PERCENTILES)
        start = b * bin_tokens
        mean = float(vals.double().mean())
        stats.append(BinStats(b, start, start + bin_tokens, vals.numel(), mean, p1, p5, p50))
    return stats


class AcceptanceMonitor:
    """Collects one step's (acceptance, position) pairs; `summary()` gives per-bin stats.

    The dense-vs-dense noise floor (same policy through engine and trainer numerics) is kept in
    its own slot so it is logged beside, never mixed into, the sparse acceptance. In data-parallel
    runs gather every rank's tokens before `update` so percentiles are over the global step.
    """

    def __init__(self, bin_tokens: int):
        if bin_tokens <= 0:
            raise ValueError(f"bin_tokens must be positive, got {bin_tokens}")
        self.bin_tokens = bin_tokens
        self.reset()

    def reset(self) -> None:
        self._acc: list[Tensor] = []
        self._pos: list[Tensor] = []
        self._floor_acc: list[Tensor] = []
        self._floor_pos: list[Tensor] = []

    def update(self, acceptance: Tensor, positions: Tensor) -> None:
        """Add sparse-vs-dense tokens: acceptance (N,), positions (N,)."""
        self._acc.append(acceptance.detach().float().cpu())
        self._pos.append(positions.detach().long().cpu())

    def update_noise_floor(self, acceptance: Tensor, positions: Tensor) -> None:
        """Add dense-rollout-vs-dense-trainer tokens: acceptance (N,), positions (N,)."""
        self._floor_acc.append(acceptance.detach().float().cpu())
        self._floor_pos.append(positions.detach().long().cpu())

    def summary(self) -> list[BinStats]:
        """Per-bin stats of the sparse acceptance collected since the last reset."""
        return self._summarise(self._acc, self._pos)

    def noise_floor_summary(self) -> list[BinStats]:
        """Per-bin stats of the noise floor collected since the last reset."""
        return self._summarise(self._floor_acc, self._floor_pos)

    def _summarise(self, acc: list[Tensor], pos: list[Tensor]) -> list[BinStats]:
        if not acc:
            return []
        return bin_acceptance(torch.cat(acc), torch.cat(pos), self.bin_tokens)
