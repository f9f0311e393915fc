"""The module DeepSpeed wraps: the HF decoder plus a chunked LM head that returns log-probs.

One call of `PolicyWithLogprobs` scores one micro-batch, so ZeRO-3's hooks see every use of
every weight. Two layouts of the same computation:
- per row: the decoder runs over each (prompt + completion) sequence;
- group-shared (`prompt_lens` and `group_ids` given): the rows of a GRPO group share their
  prompt, so the decoder runs once over each group's prompt (n_groups, P) into a KV cache, the
  cache is indexed out to the group's rows (differentiable), and the completions (B, C) attend to
  it. Exact: the same attention inputs as the per-row layout, so the same log-probs and gradient
  up to fp32 round-off, for P + sum(C_i) decoder tokens per group instead of G * (P + C).
  Why a KV cache rather than packing [prompt, c_1 .. c_G] into one sequence with a 4D block mask:
  the cache layout keeps HF's own causal/padding masks and any attention kernel (SDPA, flash),
  and its completion attention costs (G, C, P + C), where a packed block mask is a dense
  (P + G C)^2 tensor that long contexts cannot afford.
  With `share_prefix`, one level more: the token prefix common to all groups' prompts of the
  micro-batch (a system prompt and few-shot examples) runs once (1, S) into the cache, which is
  indexed out to the groups before their own prompt tokens (g, P - S) run on it: S + g (P - S)
  prompt tokens instead of g P, and the prefix positions are scored once.
Every output is (B, T) aligned to the token it describes (position 0 and padding are 0): the
losses and the monitor read the same tensors in both layouts. Prompt positions are scored once
per group (prefix positions once per micro-batch) and copied to its rows.

Given the rollout's logits of some rows (`rollout_logits`), the same chunked head also returns
their exact acceptance sum_v min(p_dense, q_sparse) at completion positions, chunk by chunk from
the dense log-probs it already holds: the update's forward then serves the monitor too
(rl.dense_pass=update), with no second dense pass and never a (b, T, V) tensor.

The group-shared layout's decoder passes are rl/shared_prompt_passes.py.
"""

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from sparrow.control.acceptance import exact_acceptance
from sparrow.distributed import Ranks
from sparrow.rl.shared_prompt_passes import GroupShared, group_shared_hidden


@dataclass
class LogprobOutput:
    """The dense policy's scores of a batch, as the actor returns them (`compute_logprobs`)."""

    token_logprobs: Tensor  # (B, T) fp32, log p(input_ids[:, t] | < t); 0 at t = 0 and on padding
    topk_ids: Tensor  # (B, T, K) int64, the top-K token ids of the distribution at t
    topk_logprobs: Tensor  # (B, T, K) fp32, their log-probs (full-vocabulary normalised)
    entropy: Tensor  # (B, T) fp32, entropy of the distribution at t (nats)


Scores = tuple[Tensor, ...]  # LogprobOutput's four fields, in its order (+ exact acceptance)
RowLogits = list[Tensor | None]  # per row: its rollout logits (C_b, V), or None (not measured)


class SparseRows(NamedTuple):
    """The rollout logits the exact acceptance compares with, in the coordinates of one `_score`
    call: row r's completion token j is scored at column offsets[r] + j."""

    logits: RowLogits  # per row (C_r, V) raw rollout logits, or None
    offsets: list[int]  # per row, the score column of its first completion token


@dataclass
class ForwardScores:
    """What an update's forward keeps for the step's other readers (rl.dense_pass=update): the
    caller asks for the top-`topk`; the actor's train_step adds each micro-batch's detached
    scores in order (micro-batches are consecutive row ranges), `output` puts them together."""

    topk: int
    parts: list[Scores] = field(default_factory=list)

    def add(self, scores: Scores) -> None:
        self.parts.append(tuple(s.detach() for s in scores))

    def output(self, device: torch.device | str = "cpu") -> tuple[LogprobOutput, Tensor | None]:
        """(the batch's LogprobOutput, its (B, T) exact acceptance or None when not asked)."""
        columns = [torch.cat([p[i] for p in self.parts]).to(device) for i in range(4)]
        exact = None
        if len(self.parts[0]) == 5:
            exact = torch.cat([p[4] for p in self.parts]).to(device)
        return LogprobOutput(*columns), exact


class PolicyWithLogprobs(nn.Module):
    """The HF model plus a chunked lm_head, as one module so DeepSpeed's hooks see every call."""

    def __init__(self, lm: PreTrainedModel, chunk_tokens: int, share_prefix: bool = True):
        super().__init__()
        self.lm = lm
        self.chunk_tokens = chunk_tokens
        self.share_prefix = share_prefix  # group-shared layout: also share the groups' prefix
        # Set by the actor under ZeRO-3 with several ranks: each lm_head call gathers its weight
        # (a collective), so every rank must make as many calls as the others, while the chunk
        # count follows each rank's own lengths. The ranks then agree on the largest count.
        self.uniform_head_calls = False

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        topk: int,
        temperature: float,
        prompt_lens: Tensor | None = None,
        group_ids: Tensor | None = None,
        rollout_logits: RowLogits | None = None,
    ) -> Scores:
        """LogprobOutput's fields as a tuple: ZeRO-3's hooks only see tensors in tuples.

        input_ids, attention_mask (b, T), right-padded. With prompt_lens and group_ids (b,),
        consecutive rows with the same group id share their prompt (checked by
        `check_shared_prompts` before the call) and it is computed once. With `rollout_logits`
        (b rows, each (C_r, V) or None; needs prompt_lens) a fifth output: (b, T) fp32 the exact
        acceptance of the rows given, at their completion positions, 0 elsewhere.
        """
        if prompt_lens is None or group_ids is None:
            sparse = None
            if rollout_logits is not None:
                assert prompt_lens is not None, "the exact acceptance needs the prompt lengths"
                # Per row, score column s predicts position s + 1: completion token j (position
                # prompt_len + j) is column prompt_len - 1 + j.
                sparse = SparseRows(rollout_logits, [int(p) - 1 for p in prompt_lens.tolist()])
            return self._per_row(input_ids, attention_mask, topk, temperature, sparse)
        return self._group_shared(
            input_ids, attention_mask, prompt_lens, group_ids, topk, temperature, rollout_logits
        )

    def _per_row(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        topk: int,
        temperature: float,
        sparse: SparseRows | None = None,
    ) -> Scores:
        batch, seq_len = input_ids.shape
        # Right padding: positions past the longest real sequence influence nothing, skip them.
        used_len = max(int(attention_mask.sum(dim=1).max().item()), 1)
        ids = input_ids[:, :used_len]  # (b, L)
        hidden = self.lm.get_decoder()(
            input_ids=ids, attention_mask=attention_mask[:, :used_len].long()
        ).last_hidden_state  # (b, L, H)
        # Hidden state at t - 1 predicts the token at t: targets are positions 1 .. L-1.
        scores = self._score(hidden[:, :-1], ids[:, 1:], topk, temperature, sparse)  # (b, L-1,.)
        scored = attention_mask.bool().clone()  # (b, T)
        scored[:, 0] = False
        return tuple(_masked(_pad_to(s, 1, seq_len), scored) for s in scores)  # (b, T, ...)

    def _group_shared(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        prompt_lens: Tensor,
        group_ids: Tensor,
        topk: int,
        temperature: float,
        rollout_logits: RowLogits | None = None,
    ) -> Scores:
        seq_len = input_ids.shape[1]
        device = input_ids.device
        shared = group_shared_hidden(
            self.lm.get_decoder(),
            input_ids,
            attention_mask,
            prompt_lens,
            group_ids,
            self.share_prefix,
        )
        prompt_scores = self._prompt_scores(
            shared, input_ids[shared.first_row], topk, temperature
        )  # (g, P - 1, ...)
        max_completion = int(shared.completion_lens.max())
        offsets = torch.arange(max_completion, device=device)  # (C,)
        completion_ids = input_ids.gather(
            1, (prompt_lens[:, None] + offsets).clamp(max=seq_len - 1)
        )  # (b, C)
        completion_ids = torch.where(offsets < shared.completion_lens[:, None], completion_ids, 0)
        # Completion score column j predicts the row's completion token j: offsets 0.
        sparse = (
            None if rollout_logits is None else SparseRows(rollout_logits, [0] * len(input_ids))
        )
        completion_scores = self._score(
            shared.hidden[:, :max_completion], completion_ids, topk, temperature, sparse
        )  # (b, C, ...)
        if sparse is not None:  # prompt positions have no rollout distribution: acceptance 0
            prompt_scores = (*prompt_scores, prompt_scores[0].new_zeros(prompt_scores[0].shape))
        row_group = shared.row_group

        t = torch.arange(seq_len, device=device)  # (T,)
        in_prompt = (t >= 1) & (t < prompt_lens[:, None])  # (b, T)
        in_completion = (t >= prompt_lens[:, None]) & attention_mask.bool()  # (b, T)
        # Completion token at position t sits at column t - prompt_len of the completion scores.
        column = (t - prompt_lens[:, None]).clamp(0, max(max_completion - 1, 0))  # (b, T)
        out = []
        for prompt_part, completion_part in zip(prompt_scores, completion_scores, strict=True):
            from_prompt = _pad_to(prompt_part, 1, seq_len)[row_group]  # (b, T, ...)
            from_completion = _gather_columns(_pad_to(completion_part, 0, seq_len), column)
            picked = torch.where(_expand_as(in_prompt, from_prompt), from_prompt, from_completion)
            out.append(_masked(picked, in_prompt | in_completion))  # (b, T, ...)
        return tuple(out)

    def _prompt_scores(
        self, shared: GroupShared, group_ids: Tensor, topk: int, temperature: float
    ) -> Scores:
        """Scores of prompt positions 1 .. P-1 of each group (g, P - 1, ...) from the hidden
        states of `group_shared_hidden`, for the groups' rows `group_ids` (g, T). The common
        prefix's positions are scored once and expanded to the groups, except its last hidden
        state, which predicts each group's first token of its own, so is scored per group."""
        prefix_len = shared.prefix_hidden.shape[1]
        num_groups, own_len = shared.prompt_hidden.shape[:2]
        prefix_scores = self._score(
            shared.prefix_hidden[:, :-1], group_ids[:1, 1:prefix_len], topk, temperature
        )  # (1, S - 1, ...), all groups' tokens 1 .. S-1
        own_hidden = torch.cat(
            [shared.prefix_hidden[:, -1:].expand(num_groups, -1, -1), shared.prompt_hidden], 1
        )[:, :-1]  # (g, P - max(S, 1), H)
        first = max(prefix_len, 1)
        own_scores = self._score(
            own_hidden, group_ids[:, first : prefix_len + own_len], topk, temperature
        )  # (g, P - max(S, 1), ...)
        return tuple(
            torch.cat([p.expand(num_groups, *p.shape[1:]), o], 1)
            for p, o in zip(prefix_scores, own_scores, strict=True)
        )

    def _score(
        self,
        hidden: Tensor,
        targets: Tensor,
        topk: int,
        temperature: float,
        sparse: SparseRows | None = None,
    ) -> Scores:
        """Scores of `targets` (n, L) from the hidden states predicting them (n, L, H), with at
        most `chunk_tokens` (rows x positions) of logits alive at once; with `sparse`, a fifth:
        the exact acceptance (n, L) of its rows, from each chunk's log-probs."""
        rows, length = targets.shape
        positions_per_chunk = max(1, self.chunk_tokens // max(rows, 1))
        chunks = -(-max(length, 1) // positions_per_chunk)  # one empty chunk when L = 0
        if self.uniform_head_calls:
            chunks = int(Ranks.of_process_group().extreme([chunks], "max"))  # extras: empty
        parts = []
        for c in range(chunks):
            start = min(c * positions_per_chunk, length)
            end = min(start + positions_per_chunk, length)
            args = (hidden[:, start:end], targets[:, start:end], topk, temperature, sparse, start)
            if torch.is_grad_enabled():
                # Recompute the chunk's logits in backward instead of keeping them all alive
                # (the recomputation stops once the gather's inputs are back: checkpoint's early
                # stop, so the no-grad top-K, entropy and acceptance are not computed twice).
                parts.append(checkpoint(self._score_chunk, *args, use_reentrant=False))
            else:
                parts.append(self._score_chunk(*args))
        return tuple(torch.cat([p[i] for p in parts], dim=1) for i in range(len(parts[0])))

    def _score_chunk(
        self,
        hidden: Tensor,
        targets: Tensor,
        topk: int,
        temperature: float,
        sparse: SparseRows | None = None,
        start: int = 0,
    ) -> Scores:
        logits = self.lm.get_output_embeddings()(hidden).float() / temperature  # (n, c, V)
        logprobs = F.log_softmax(logits, dim=-1)  # (n, c, V)
        token_lp = logprobs.gather(-1, targets[..., None]).squeeze(-1)  # (n, c)
        with torch.no_grad():
            entropy = -(logprobs.exp() * logprobs).sum(-1)  # (n, c)
            topk_lp, topk_ids = logprobs.topk(topk, dim=-1)  # (n, c, K)
            if sparse is None:
                return token_lp, topk_ids, topk_lp, entropy
            accept = _chunk_acceptance(logprobs, sparse, start, temperature)  # (n, c)
        return token_lp, topk_ids, topk_lp, entropy, accept


def _chunk_acceptance(
    logprobs: Tensor, sparse: SparseRows, start: int, temperature: float
) -> Tensor:
    """(n, c) fp32 exact acceptance of the chunk's columns start .. start + c - 1 whose row has
    rollout logits, 0 elsewhere; `logprobs` (n, c, V) the dense ones at `temperature`. One row's
    slice of rollout logits is normalised at a time, so at most (c, V) of them exist at once."""
    rows, width = logprobs.shape[:2]
    accept = logprobs.new_zeros(rows, width)  # (n, c)
    for r, row_logits in enumerate(sparse.logits):
        if row_logits is None:
            continue
        first = sparse.offsets[r]  # the column of its completion token 0
        lo, hi = max(start, first), min(start + width, first + len(row_logits))
        if lo >= hi:
            continue
        q = row_logits[lo - first : hi - first].to(logprobs.device).float() / temperature
        accept[r, lo - start : hi - start] = exact_acceptance(
            logprobs[r, lo - start : hi - start], F.log_softmax(q, -1)
        )  # (hi - lo,)
    return accept


def _pad_to(scores: Tensor, offset: int, length: int) -> Tensor:
    """(n, L, ...) -> (n, length, ...): `offset` zero positions before, zeros after."""
    pad = [0, 0] * (scores.ndim - 2) + [offset, length - offset - scores.shape[1]]
    return F.pad(scores, pad)


def _gather_columns(scores: Tensor, column: Tensor) -> Tensor:
    """scores (b, L, ...) read at column (b, T) -> (b, T, ...)."""
    index = column.reshape(*column.shape, *([1] * (scores.ndim - 2))).expand(
        *column.shape, *scores.shape[2:]
    )
    return scores.gather(1, index)


def _expand_as(mask: Tensor, like: Tensor) -> Tensor:
    return mask.reshape(*mask.shape, *([1] * (like.ndim - mask.ndim)))


def _masked(scores: Tensor, keep: Tensor) -> Tensor:
    """Zero `scores` (b, T, ...) where `keep` (b, T) is False."""
    return torch.where(_expand_as(keep, scores), scores, 0)
