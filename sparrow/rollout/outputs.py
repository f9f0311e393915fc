"""What generation returns per sample, and the preallocated buffers that record it token by token.

Per generated token the engine records the sampled token's log-probs, the top-K of the rollout
policy, the KV pages each sparse layer read to produce it (all pages when attended densely: the
prefill token, dense sequences, and tokens after a preemption recompute) and the context length
it was produced at (tokens before it). One indexed write per step for the whole batch, no
per-token Python. On request (`SamplingParams.return_logits`) it also keeps, for chosen
sequences, the raw logits each token was sampled from (`LogitsStore`).
"""

from dataclasses import dataclass, field

import torch
from torch import Tensor

from sparrow.rollout.sampler import SamplerOutput
from sparrow.rollout.scheduler import DecodeBatch, PrefillBatch
from sparrow.rollout.sequence import Sequence


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
    # (T, V) fp32 raw logits (before temperature, top-k, top-p) each token was sampled from;
    # None unless generate was asked for them (SamplingParams.return_logits)
    logits: Tensor | None = None
    # A multi-turn episode (rollout/episodes.py): token_ids hold every turn and the
    # observations between them; (T,) bool True on the observation tokens, which the policy did
    # not sample (their per-token records are 0). None: a single-turn completion.
    observation_mask: Tensor | None = None
    episode: "EpisodeInfo | None" = None  # the episode's turns, reward and tool counts


@dataclass
class EpisodeInfo:
    """What a multi-turn episode did besides its tokens (rollout/episodes.py)."""

    turns: int  # assistant turns sampled
    reward: float  # the sum of the environment's per-turn rewards
    tool_calls: int  # parsed in the assistant turns
    tool_errors: int  # of those, failed (malformed, raised, timed out, too big, non-text)
    observation_tokens: int  # appended after the assistant turns (mask 0)
    truncated_observations: int  # observations cut to env.max_observation_tokens
    # Per continuation (turn 2 on): tokens its prefill chunk computed onto the cached K/V (the
    # closing token of the turn before, which no decode step wrote, plus the observation).
    chunk_tokens: list[int] = field(default_factory=list)


@dataclass
class DraftAcceptance:
    """Per drafted token the speculative rule tested (up to and including each round's first
    rejection), of sequences drafting under a sparse schedule: the measured acceptance by
    position and budget, which the monitor bins and the throughput controller reads."""

    positions: list[int] = field(default_factory=list)  # absolute: tokens its draft attended
    budget_pages: list[int | None] = field(default_factory=list)  # the schedule's budget there
    values: list[float] = field(default_factory=list)  # sum_v min(p(v), q(v))

    def add(self, seqs: list[Sequence], per_seq: list[Tensor]) -> None:
        """A round's `per_seq` (m_i,) acceptances of `seqs` (before the round's tokens are
        appended, so draft i of a sequence sits at its num_tokens + i); dense rows (no
        schedule: the noise floor) draft with the target itself and are left out."""
        for seq, values in zip(seqs, per_seq, strict=True):
            if seq.schedule is None:
                continue
            positions = range(seq.num_tokens, seq.num_tokens + len(values))
            self.positions += positions
            self.budget_pages += [seq.schedule(t) for t in positions]
            self.values += values.tolist()

    def __add__(self, other: "DraftAcceptance") -> "DraftAcceptance":
        return DraftAcceptance(
            self.positions + other.positions,
            self.budget_pages + other.budget_pages,
            self.values + other.values,
        )


@dataclass
class GenerateStats:
    """Where one generate call spent its time (wall clock, each step including sampling)."""

    num_preemptions: int = 0  # sequences evicted and recomputed
    prefill_s: float = 0.0  # seconds in prefill steps
    decode_s: float = 0.0  # seconds in decode steps
    # Tokens run through prefill (a shared prompt counts once; a shared prefix once, by generate).
    prefill_tokens: int = 0
    decode_tokens: int = 0  # tokens generated by decode steps
    # Speculative decoding (speculative.py): tokens drafted by sparse steps, and those kept.
    spec_rounds: int = 0  # draft-and-verify rounds (decode steps in that mode)
    spec_verified: int = 0  # sequences verified, summed over rounds (one dense pass each)
    spec_drafted: int = 0
    spec_accepted: int = 0
    spec_draft_s: float = 0.0  # of decode_s: drafting (sparse decode steps)
    spec_verify_s: float = 0.0  # of decode_s: the dense pass and the accept/resample step
    spec_accept: DraftAcceptance = field(default_factory=DraftAcceptance)

    def add_step(self, batch: PrefillBatch | DecodeBatch, seconds: float, tokens: int) -> None:
        """A step's time; `tokens`: those it appended (one per sequence, more in a speculative
        round)."""
        if isinstance(batch, DecodeBatch):
            self.decode_s += seconds
            self.decode_tokens += tokens
            return
        self.prefill_s += seconds
        # num_tokens - 1: the token sampled by the step is already appended.
        self.prefill_tokens += sum(
            g[0].num_tokens - 1 - g[0].num_cached_tokens for g in batch.groups
        )

    def add_round(self, seqs: list[Sequence], spec) -> None:
        """A speculative round of `seqs` (its SpeculativeStep `spec`), before its tokens are
        appended."""
        self.spec_rounds += 1
        self.spec_verified += len(seqs)
        self.spec_drafted += spec.drafted
        self.spec_accepted += spec.accepted
        self.spec_draft_s += spec.draft_s
        self.spec_verify_s += spec.verify_s
        self.spec_accept.add(seqs, spec.draft_accept)

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


class TokenRecords:
    """(num_seqs, capacity, ...) buffers filled one step at a time. The token axis starts small
    and doubles when a sequence outgrows it (up to max_tokens), so memory follows the longest
    completion so far rather than max_tokens (32K-token caps with a few hundred sequences)."""

    # The buffers `_grow` sets by name, one per `_specs` entry.
    logprobs: Tensor
    sampling_logprobs: Tensor
    topk_ids: Tensor
    topk_logprobs: Tensor
    budget_pages: Tensor
    context_lens: Tensor

    def __init__(self, num_seqs: int, max_tokens: int, topk: int, device: torch.device):
        self.max_tokens = max_tokens
        self.device = device
        self.capacity = 0
        self._specs = {  # name -> (dtype, device, trailing shape)
            "logprobs": (torch.float32, device, ()),
            "sampling_logprobs": (torch.float32, device, ()),
            # int32 halves the largest buffer; ids are widened to int64 on output.
            "topk_ids": (torch.int32, device, (topk,)),
            "topk_logprobs": (torch.float32, device, (topk,)),
            "budget_pages": (torch.int32, torch.device("cpu"), ()),
            "context_lens": (torch.int32, torch.device("cpu"), ()),
        }
        self.num_seqs = num_seqs
        self._grow(min(max_tokens, 256))

    def _grow(self, capacity: int) -> None:
        for name, (dtype, device, tail) in self._specs.items():
            buf = torch.zeros((self.num_seqs, capacity, *tail), dtype=dtype, device=device)
            if self.capacity:
                buf[:, : self.capacity] = getattr(self, name)
            setattr(self, name, buf)
        self.capacity = capacity

    def write(
        self,
        seq_ids: list[int],
        positions: list[int],
        sampled: SamplerOutput,
        budget_pages: list[int],
        context_lens: list[int],
    ) -> None:
        if max(positions) >= self.capacity:
            self._grow(min(self.max_tokens, 2 * self.capacity))
        # One host-to-device copy for both index vectors, pinned and non-blocking on CUDA: the
        # step's only device-to-host transfer stays the sampled tokens the engine reads back.
        index = torch.tensor([seq_ids, positions], dtype=torch.int64)  # (2, B)
        if self.device.type == "cuda":
            index = index.pin_memory()
        rows, cols = index.to(self.device, non_blocking=True)  # (B,) each
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


class LogitsStore:
    """Raw logits of the sampled tokens of the sequences asked for, one (V,) fp32 row per token,
    on the CPU. Each step copies only the wanted rows of its (B, V) logits. A row is written at
    its token's position, so a sequence holds exactly one row per completion token whatever the
    scheduler did (a recompute after a preemption samples the next token, never an earlier one).
    """

    def __init__(self, wanted: list[bool]):
        self.wanted = wanted  # per seq_id: keep its logits
        self.rows: list[list[Tensor]] = [[] for _ in wanted]  # per seq_id, per token: (V,)

    def append(self, seq_ids: list[int], positions: list[int], logits: Tensor) -> None:
        """logits (B, V): row i is what seq_ids[i]'s token at positions[i] was sampled from."""
        picks = [i for i, s in enumerate(seq_ids) if self.wanted[s]]
        if not picks:
            return
        kept = logits[picks].to("cpu", torch.float32)  # (b, V), a copy of the wanted rows only
        for row, i in zip(kept, picks, strict=True):
            rows = self.rows[seq_ids[i]]
            del rows[positions[i] :]
            rows.append(row)

    def output(self, seq_id: int, num_tokens: int) -> Tensor | None:
        """(num_tokens, V) fp32 for a wanted sequence (its store is released), else None."""
        if not self.wanted[seq_id]:
            return None
        rows, self.rows[seq_id] = self.rows[seq_id], []
        if len(rows) != num_tokens:
            raise RuntimeError(f"sequence {seq_id} kept {len(rows)} logits for {num_tokens} tokens")
        return torch.stack(rows)  # (T, V)
