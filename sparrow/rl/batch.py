"""The rollout batch: what the engine hands to rewards, the dense actor, the monitor and the loss.

Alignment rule: the token at absolute position t of a sample (prompt + completion) was sampled
from the distribution conditioned on tokens < t, and every per-token array is aligned to the
position of the token it describes. So `sampled_logprobs[b, t]` is the rollout policy's log-prob
of `input_ids[b, t]`, to be compared with the actor's log-softmax of logits[b, t - 1].

Two rollout log-probs per token, for two questions. `sampled_logprobs` (full vocabulary) is the
sparse *policy*: the monitor compares it with the dense one. `behaviour_logprobs` is the
distribution the token was actually *drawn* from, top-k/top-p truncated and renormalised: an
importance weight pi/q is unbiased only with that q. With the full log-prob every kept token's
weight is divided by the kept mass S (log-ratio off by -log S), tests/rl/test_behaviour_logprobs.py.
Without truncation the two are the same tensor values.
Part of the RL algorithm's data, not of rollout/: `collate_rollouts` reads the engine's outputs by
attribute, without importing it, so the engine never depends on the algorithm.
"""

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
from torch import Tensor


@dataclass
class RolloutBatch:
    input_ids: Tensor  # (B, T) int64, prompt + completion, right-padded with pad_token_id
    attention_mask: Tensor  # (B, T) bool, True on real tokens
    completion_mask: Tensor  # (B, T) bool, True on generated tokens (what is trained/scored)
    prompt_lens: Tensor  # (B,) int64
    sampled_logprobs: Tensor  # (B, T) fp32, rollout (sparse) policy log-prob of input_ids[:, t],
    # full vocabulary at the sampling temperature; 0 off-completion
    topk_ids: Tensor  # (B, T, K) int64, rollout policy's top-K token ids at t; 0 off-completion
    topk_logprobs: Tensor  # (B, T, K) fp32, their log-probs (full-vocab normalised); 0 off
    budget_pages: Tensor  # (B, T) int32, KV pages read per sparse layer to produce token t
    # (= all pages when attended densely); 0 off-completion
    group_ids: Tensor  # (B,) int64, index of the prompt each sample came from
    finish_reasons: list[str]  # "eos" | "stop" | "length"
    # Per row, the raw fp32 logits (C_b, V) its completion tokens were sampled from (the engine's
    # SamplingParams.return_logits), None for a row without; None when no row has them
    rollout_logits: list[Tensor | None] | None = None
    # (B, T) fp32, log-prob of input_ids[:, t] under the top-k/top-p truncated distribution it was
    # drawn from (the IS weight's denominator); None: not truncated, `sampled_logprobs` is it
    behaviour_logprobs: Tensor | None = None
    # (B,) int64, per row the weight version that sampled it (the number of policy updates the
    # rollout engine's weights held): with an asynchronous rollout (rl.async.staleness) a row
    # can be older than the weights it trains; None where nobody tracks versions
    weight_version: Tensor | None = None

    @property
    def drawn_logprobs(self) -> Tensor:
        """(B, T) the log-probs of the distribution each token was drawn from."""
        return self.sampled_logprobs if self.behaviour_logprobs is None else self.behaviour_logprobs

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: Tensor) -> "RolloutBatch":
        """The samples at `rows` (B',) int64, in that order."""
        index = rows.tolist()

        def pick(value):
            if isinstance(value, Tensor):
                return value[rows]
            return None if value is None else [value[i] for i in index]

        return RolloutBatch(**{f.name: pick(getattr(self, f.name)) for f in fields(self)})

    def to(self, device: torch.device | str) -> "RolloutBatch":
        moved = {
            f.name: getattr(self, f.name).to(device)
            if isinstance(getattr(self, f.name), Tensor)
            else getattr(self, f.name)
            for f in fields(self)
        }
        return RolloutBatch(**moved)


def collate_rollouts(
    prompts: Sequence[Sequence[int]],
    outputs: Sequence,
    pad_token_id: int,
    group_ids: Sequence[int] | None = None,
    weight_version: int | None = None,
) -> RolloutBatch:
    """Pad the engine's outputs (sparrow.rollout GenerationOutput) into one batch.

    prompts: the prompt token ids, indexed by each output's `prompt_index`.
    group_ids: one per output; defaults to each output's `prompt_index` (pass global prompt
    indices when a rank generated a slice of the step's prompts).
    Outputs' logits, where the engine kept them, are passed on by reference (no copy).
    weight_version: the version of the weights that sampled every output (None: untracked).
    """
    if not outputs:
        raise ValueError("collate_rollouts needs at least one output")
    if group_ids is None:
        group_ids = [o.prompt_index for o in outputs]
    if len(group_ids) != len(outputs):
        raise ValueError(f"{len(group_ids)} group_ids for {len(outputs)} outputs")
    padded = _pad_per_token(prompts, outputs, pad_token_id)
    behaviour_logprobs = padded.pop("behaviour_logprobs")
    drawn_full = behaviour_logprobs.equal(padded["sampled_logprobs"])  # no top-p/top-k truncation
    return RolloutBatch(
        input_ids=padded["input_ids"],
        attention_mask=padded["attention_mask"],
        completion_mask=padded["completion_mask"],
        prompt_lens=padded["prompt_lens"],
        sampled_logprobs=padded["sampled_logprobs"],
        topk_ids=padded["topk_ids"],
        topk_logprobs=padded["topk_logprobs"],
        budget_pages=padded["budget_pages"],
        group_ids=torch.tensor(list(group_ids), dtype=torch.int64),
        finish_reasons=[o.finish_reason for o in outputs],
        rollout_logits=_rollout_logits(outputs),
        behaviour_logprobs=None if drawn_full else behaviour_logprobs,
        weight_version=None
        if weight_version is None
        else torch.full((len(outputs),), weight_version, dtype=torch.int64),
    )


def _pad_per_token(
    prompts: Sequence[Sequence[int]], outputs: Sequence, pad_token_id: int
) -> dict[str, Tensor]:
    """RolloutBatch's per-token tensors (and `behaviour_logprobs`, always filled here) by field
    name: each output's values at its completion positions, right-padded to the longest sample
    (pad_token_id in input_ids, 0 and False elsewhere), and `prompt_lens`."""
    batch = len(outputs)
    k = outputs[0].topk_ids.shape[-1]
    lengths = [len(prompts[o.prompt_index]) + len(o.token_ids) for o in outputs]
    width = max(lengths)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.int64)
    attention_mask = torch.zeros((batch, width), dtype=torch.bool)
    completion_mask = torch.zeros((batch, width), dtype=torch.bool)
    sampled_logprobs = torch.zeros((batch, width), dtype=torch.float32)
    behaviour_logprobs = torch.zeros((batch, width), dtype=torch.float32)
    topk_ids = torch.zeros((batch, width, k), dtype=torch.int64)
    topk_logprobs = torch.zeros((batch, width, k), dtype=torch.float32)
    budget_pages = torch.zeros((batch, width), dtype=torch.int32)
    prompt_lens = torch.zeros(batch, dtype=torch.int64)
    for b, out in enumerate(outputs):
        prompt = list(prompts[out.prompt_index])
        if list(out.prompt_ids) != prompt:
            raise ValueError(
                f"output {b} was generated from another prompt than prompts[{out.prompt_index}]"
            )
        p, end = len(prompt), lengths[b]
        input_ids[b, :end] = torch.tensor(prompt + list(out.token_ids), dtype=torch.int64)
        attention_mask[b, :end] = True
        # An episode's observation tokens (the environment's, not sampled) stay out of the mask:
        # out of the loss, the rollout correction, the acceptance monitor and the mismatch metrics.
        observed = getattr(out, "observation_mask", None)
        completion_mask[b, p:end] = True if observed is None else ~observed
        sampled_logprobs[b, p:end] = out.logprobs
        behaviour_logprobs[b, p:end] = out.sampling_logprobs
        topk_ids[b, p:end] = out.topk_ids
        topk_logprobs[b, p:end] = out.topk_logprobs
        budget_pages[b, p:end] = out.budget_pages
        prompt_lens[b] = p
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "completion_mask": completion_mask,
        "prompt_lens": prompt_lens,
        "sampled_logprobs": sampled_logprobs,
        "topk_ids": topk_ids,
        "topk_logprobs": topk_logprobs,
        "budget_pages": budget_pages,
        "behaviour_logprobs": behaviour_logprobs,
    }


def _rollout_logits(outputs: Sequence) -> list[Tensor | None] | None:
    logits = [getattr(o, "logits", None) for o in outputs]
    return None if all(x is None for x in logits) else logits
