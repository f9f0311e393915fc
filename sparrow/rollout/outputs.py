"""What generation returns per sample, and the preallocated buffers that record it token by token.

Per generated token the engine records the sampled token's log-probs, the top-K of the rollout
policy, the KV pages each sparse layer read to produce it (all pages when attended densely: the
prefill token, dense sequences, and tokens after a preemption recompute) and the context length
it was produced at (tokens before it). One indexed write per step for the whole batch, no
per-token Python.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from sparrow.rollout.sampler import SamplerOutput


@dataclass
class GenerationOutput:
    prompt_index: int  # index of the prompt in the generate call
    sample_index: int  # 0..n-1 among that prompt's samples
    prompt_ids: list[int]
    token_ids: list[int]  # completion, including the EOS / stop token that ended it
    text: str  # decoded completion, special tokens skipped
    finish_reason: str  # "eos" | "stop" | "length"
    logprobs: Tensor  # (T,) fp32, full-vocabulary log-prob at the temperature (rollout policy)
    sampling_logprobs: Tensor  # (T,) fp32, under the top-k/top-p truncated distribution
    topk_ids: Tensor  # (T, K) int64
    topk_logprobs: Tensor  # (T, K) fp32, full-vocabulary
    budget_pages: Tensor  # (T,) int32, KV pages read per sparse layer for each token
    context_lens: Tensor  # (T,) int32, tokens in the context each token was produced from
    num_preemptions: int  # times this sample was evicted and recomputed


class TokenRecords:
    """(num_seqs, max_tokens, ...) buffers filled one decode step at a time."""

    def __init__(self, num_seqs: int, max_tokens: int, topk: int, device: torch.device):
        shape = (num_seqs, max_tokens)
        self.logprobs = torch.zeros(shape, dtype=torch.float32, device=device)
        self.sampling_logprobs = torch.zeros(shape, dtype=torch.float32, device=device)
        # int32 halves the largest buffer; ids are widened to int64 on output.
        self.topk_ids = torch.zeros((*shape, topk), dtype=torch.int32, device=device)
        self.topk_logprobs = torch.zeros((*shape, topk), dtype=torch.float32, device=device)
        self.budget_pages = torch.zeros(shape, dtype=torch.int32)
        self.context_lens = torch.zeros(shape, dtype=torch.int32)
        self.device = device

    def write(
        self,
        seq_ids: list[int],
        positions: list[int],
        sampled: SamplerOutput,
        budget_pages: list[int],
        context_lens: list[int],
    ) -> None:
        rows = torch.tensor(seq_ids, device=self.device)  # (B,)
        cols = torch.tensor(positions, device=self.device)  # (B,)
        self.logprobs[rows, cols] = sampled.logprobs
        self.sampling_logprobs[rows, cols] = sampled.sampling_logprobs
        self.topk_ids[rows, cols] = sampled.topk_ids.to(torch.int32)
        self.topk_logprobs[rows, cols] = sampled.topk_logprobs
        self.budget_pages[seq_ids, positions] = torch.tensor(budget_pages, dtype=torch.int32)
        self.context_lens[seq_ids, positions] = torch.tensor(context_lens, dtype=torch.int32)

    def output(self, seq_id: int, num_tokens: int, **fields) -> GenerationOutput:
        """The first `num_tokens` records of `seq_id` as copies; `fields` fill the rest."""
        t = num_tokens
        return GenerationOutput(
            **fields,
            logprobs=self.logprobs[seq_id, :t].to("cpu", copy=True),
            sampling_logprobs=self.sampling_logprobs[seq_id, :t].to("cpu", copy=True),
            topk_ids=self.topk_ids[seq_id, :t].to("cpu", torch.int64),
            topk_logprobs=self.topk_logprobs[seq_id, :t].to("cpu", copy=True),
            budget_pages=self.budget_pages[seq_id, :t].clone(),
            context_lens=self.context_lens[seq_id, :t].clone(),
        )
