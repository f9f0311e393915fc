"""Token sampling with temperature, top-k and top-p, and the log-probs RL needs for each token.

For every sampled token it returns two log-probs:
- `logprobs`: full-vocabulary log-softmax of logits / temperature. This is the rollout policy the
  acceptance monitor compares with the dense one: top-k/top-p truncation is a sampling device,
  and the monitor compares policies, not draws.
- `sampling_logprobs`: under the truncated, renormalised distribution actually sampled from: the
  importance weight's denominator (sparrow.rl.batch), the only one that keeps it unbiased.
plus the top-K ids and full-vocabulary log-probs (K = `topk_logprobs`). Greedy (temperature 0)
reports log-probs at temperature 1. Seeded through one torch.Generator: the same engine seed and
the same batches give the same tokens.
"""

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class SamplerOutput:
    token_ids: Tensor  # (B,) int64
    logprobs: Tensor  # (B,) fp32, full-vocabulary log-prob at the temperature
    sampling_logprobs: Tensor  # (B,) fp32, under the top-k/top-p truncated distribution
    topk_ids: Tensor  # (B, K) int64, most likely tokens, descending
    topk_logprobs: Tensor  # (B, K) fp32, their full-vocabulary log-probs


class Sampler:
    def __init__(self, topk_logprobs: int, seed: int, device: torch.device):
        self.topk_logprobs = topk_logprobs
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def __call__(
        self, logits: Tensor, temperature: float, top_p: float = 1.0, top_k: int | None = None
    ) -> SamplerOutput:
        """logits (B, V) fp32 -> one token per row."""
        dist = Distributions(logits, temperature, top_p, top_k)
        if dist.logprobs_trunc is None:  # greedy
            token_ids = logits.argmax(dim=-1)  # (B,)
        else:
            token_ids = self._draw(dist.logprobs_trunc)  # (B,)
        return self.record(dist, token_ids)

    def record(self, dist: "Distributions", token_ids: Tensor) -> SamplerOutput:
        """The log-probs and top-K of given tokens (B,) under `dist`: what __call__ returns for
        tokens it drew, and for tokens drawn elsewhere from the same distributions (speculative
        decoding's accepted drafts)."""
        if dist.logprobs_trunc is None:  # greedy
            sampling_logprobs = torch.zeros(token_ids.shape, device=token_ids.device)  # fp32
        else:
            sampling_logprobs = dist.logprobs_trunc.gather(1, token_ids[:, None])[:, 0]
        topk = dist.logprobs_full.topk(self.topk_logprobs, dim=-1)  # (B, K)
        return SamplerOutput(
            token_ids=token_ids,
            logprobs=dist.logprobs_full.gather(1, token_ids[:, None])[:, 0],
            sampling_logprobs=sampling_logprobs,
            topk_ids=topk.indices,
            topk_logprobs=topk.values,
        )

    def draw_from(self, probs: Tensor) -> Tensor:
        """One token per row of probs (B, V) (rows need not be normalised), by inverse CDF."""
        return self._draw(probs, is_log=False)

    def uniforms(self, n: int) -> Tensor:
        """n uniforms in [0, 1) from the sampler's stream (speculative acceptance tests)."""
        return torch.rand((n,), generator=self.generator, device=self.generator.device)

    def _draw(self, weights: Tensor, is_log: bool = True) -> Tensor:
        """Inverse-CDF sampling, one uniform per row: on CPU ~8x cheaper than one exponential or
        Gumbel draw per vocabulary entry. `right=True` never lands on a zero-probability token."""
        cdf = (weights.exp() if is_log else weights).cumsum(dim=-1)  # (B, V)
        u = torch.rand((cdf.shape[0], 1), generator=self.generator, device=cdf.device)
        token_ids = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)[:, 0]  # (B,)
        return token_ids.clamp_(max=cdf.shape[1] - 1)


class Distributions:
    """What a sampling step draws from, for logits (B, V) fp32 under temperature, top-p, top-k:
    the full-vocabulary log-probs at the temperature (the policy), and the truncated ones drawn
    from (None when greedy). `probs()` is the distribution a token is drawn from (greedy: one-hot
    on the argmax), which speculative decoding compares between draft and target."""

    def __init__(self, logits: Tensor, temperature: float, top_p: float, top_k: int | None):
        self.logits = logits
        greedy = temperature == 0.0
        scaled = logits if greedy or temperature == 1.0 else logits / temperature  # (B, V)
        self.logprobs_full = torch.log_softmax(scaled, dim=-1)  # (B, V)
        self.logprobs_trunc: Tensor | None = None
        if not greedy:
            truncated = truncate(scaled, top_p, top_k)  # (B, V), -inf outside the kept set
            self.logprobs_trunc = (
                self.logprobs_full if truncated is scaled else truncated.log_softmax(-1)
            )

    def probs(self) -> Tensor:
        """(B, V) fp32: the distribution each row's token is drawn from."""
        if self.logprobs_trunc is None:
            one_hot = torch.zeros_like(self.logits)
            return one_hot.scatter_(1, self.logits.argmax(dim=-1, keepdim=True), 1.0)
        return self.logprobs_trunc.exp()


def truncate(scaled_logits: Tensor, top_p: float, top_k: int | None) -> Tensor:
    """Mask (to -inf) tokens outside top-k, then outside the top-p nucleus of what is left.
    Returns the input itself when neither is active."""
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    out = scaled_logits
    vocab = out.shape[-1]
    if top_k is not None and top_k < vocab:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
        kth = out.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = out.sort(dim=-1, descending=True)  # (B, V)
        probs = sorted_logits.softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a token once the mass before it
        # already does (the most likely token is always kept).
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p  # (B, V)
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out
