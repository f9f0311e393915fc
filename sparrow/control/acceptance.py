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
and takes percentiles per bin (`bin_acceptance`). Pure math: the monitor (sparrow/monitor/) decides
which tokens are measured and pools them over ranks.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

PERCENTILES = (0.01, 0.05, 0.5)  # p1, p5, p50 of BinStats


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
