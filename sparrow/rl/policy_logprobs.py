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
"""

import inspect
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache, PreTrainedModel

from sparrow.control.acceptance import exact_acceptance
from sparrow.distributed import Ranks


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
        self, shared: "GroupShared", group_ids: Tensor, topk: int, temperature: float
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


class GroupShared(NamedTuple):
    """What `group_shared_hidden` returns; g groups, b rows, a prefix of S tokens common to
    every group's prompt (S = 0 when not shared), prompts right-padded to the longest (P)."""

    prefix_hidden: Tensor  # (1, S, H) the prompt prefix common to every group, computed once
    prompt_hidden: Tensor  # (g, P - S, H) each group's prompt after the common prefix
    hidden: Tensor  # (b, 1 + F, H): column j predicts the row's completion token j
    first_row: Tensor  # (g,) the first row of each group
    row_group: Tensor  # (b,) the group of each row
    completion_lens: Tensor  # (b,)


def group_shared_hidden(
    decoder: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_lens: Tensor,
    group_ids: Tensor,
    share_prefix: bool = True,
) -> GroupShared:
    """Final hidden states of right-padded rows (b, T) whose consecutive rows with the same
    group id share their prompt, in up to three decoder passes over one KV cache:
    1. with `share_prefix`, the longest token prefix common to all groups' prompts (S tokens,
       leaving each group at least one prompt token of its own) runs once (1, S), and the cache
       is indexed out to the g groups;
    2. each group's prompt after the prefix (g, P - S) runs on it, positions offset by S;
    3. the cache is indexed out to the group's rows and the completions (b, F) run on it.
    Each indexing is differentiable: a prefix's K/V gets the gradient of everything after it.

    Every call makes the same module calls whatever the data: ZeRO-3 gathers each module's
    weights per call, and a rank that skipped a pass would leave the others waiting. So pass 1
    runs whenever `share_prefix` is on, over one (then masked) token when the prompts share
    none, and pass 3 over at least one (then masked) token when all completions are one token.
    """
    device = input_ids.device
    first_row, row_group = _group_rows(group_ids)  # (g,), (b,)
    completion_lens = attention_mask.sum(1) - prompt_lens  # (b,)
    max_prompt = int(prompt_lens.max())
    prompt_ids = input_ids[first_row, :max_prompt]  # (g, P)
    key_mask = torch.arange(max_prompt, device=device) < prompt_lens[:, None]  # (b, P)

    cache = DynamicCache(config=decoder.config)
    cache_kw = cache_keyword(decoder)
    prefix_len = 0
    prefix_key_mask = key_mask[first_row, :0]  # (g, 0) the cached prefix keys each group sees
    prefix_hidden = None
    if share_prefix:
        prefix_len, prefix_hidden, prefix_key_mask = _prefix_pass(
            decoder, cache, cache_kw, prompt_ids, prompt_lens[first_row]
        )

    prompt_hidden = _prompt_pass(
        decoder, cache, cache_kw, prompt_ids, prefix_len, prefix_key_mask, key_mask[first_row]
    )  # (g, P - S, H)
    if prefix_hidden is None:
        prefix_hidden = prompt_hidden[:1, :0]  # (1, 0, H)
    # The last prompt position (never in the prefix) predicts every row's first completion token.
    last_prompt = prompt_hidden[row_group, prompt_lens - 1 - prefix_len]  # (b, H)

    cache.batch_select_indices(row_group)  # the group's prompt K/V for each of its rows
    prompt_keys = [prefix_key_mask[row_group], key_mask[:, prefix_len:]]  # (b, P) in all
    completion = _completion_pass(
        decoder, cache, cache_kw, input_ids, prompt_lens, completion_lens, prompt_keys
    )  # (b, F, H)
    hidden = torch.cat([last_prompt[:, None], completion], 1)  # (b, 1 + F, H)
    return GroupShared(prefix_hidden, prompt_hidden, hidden, first_row, row_group, completion_lens)


def _group_rows(group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """(first_row (g,), row_group (b,)): the first row of each run of equal group ids, and the
    run each row is in (runs, not ids: a group is its consecutive rows)."""
    starts = torch.ones(len(group_ids), dtype=torch.bool, device=group_ids.device)  # (b,)
    starts[1:] = group_ids[1:] != group_ids[:-1]
    return starts.nonzero().squeeze(1), starts.cumsum(0) - 1


def _prompt_pass(
    decoder: PreTrainedModel,
    cache: DynamicCache,
    cache_kw: str,
    prompt_ids: Tensor,
    prefix_len: int,
    prefix_key_mask: Tensor,
    group_key_mask: Tensor,
) -> Tensor:
    """Pass 2 of `group_shared_hidden`: each group's prompt (g, P) after the first `prefix_len`
    tokens, on `cache` holding the prefix (keys masked by `prefix_key_mask`), positions offset
    by the prefix; `group_key_mask` (g, P) marks each prompt's real tokens. (g, P - S, H)."""
    num_groups, max_prompt = prompt_ids.shape
    own_len = max_prompt - prefix_len
    positions = prefix_len + torch.arange(own_len, device=prompt_ids.device)  # (P - S,)
    prompt_hidden = decoder(
        input_ids=prompt_ids[:, prefix_len:],
        attention_mask=torch.cat([prefix_key_mask, group_key_mask[:, prefix_len:]], 1).long(),
        position_ids=positions.expand(num_groups, -1),
        use_cache=True,
        **{cache_kw: cache},
    ).last_hidden_state  # (g, P - S, H)
    _check_cache_filled(cache, prefix_key_mask.shape[1] + own_len, decoder, cache_kw)
    return prompt_hidden


def _prefix_pass(
    decoder: PreTrainedModel,
    cache: DynamicCache,
    cache_kw: str,
    prompt_ids: Tensor,
    prompt_lens: Tensor,
) -> tuple[int, Tensor, Tensor]:
    """Pass 1 of `group_shared_hidden` over the groups' prompts (g, P) of lengths (g,): the
    longest common prefix runs once and `cache` is indexed out to every group. Returns (S,
    its hidden states (1, S, H), the (g, max(S, 1)) key mask of the cached prefix)."""
    device = prompt_ids.device
    num_groups = prompt_ids.shape[0]
    prefix_len = common_prefix_len(prompt_ids, prompt_lens)
    # No common token: one token of the first prompt stands in, masked out of every later
    # query, so that every rank still makes the pass.
    cached = max(prefix_len, 1)
    prefix_hidden = decoder(
        input_ids=prompt_ids[:1, :cached],
        attention_mask=torch.ones(1, cached, dtype=torch.long, device=device),
        position_ids=torch.arange(cached, device=device)[None],
        use_cache=True,
        **{cache_kw: cache},
    ).last_hidden_state[:, :prefix_len]  # (1, S, H)
    _check_cache_filled(cache, cached, decoder, cache_kw)
    every_group = torch.zeros(num_groups, dtype=torch.long, device=device)  # (g,)
    cache.batch_select_indices(every_group)  # the prefix for every group
    prefix_key_mask = torch.full((num_groups, cached), prefix_len > 0, device=device)
    return prefix_len, prefix_hidden, prefix_key_mask


def _completion_pass(
    decoder: PreTrainedModel,
    cache: DynamicCache,
    cache_kw: str,
    input_ids: Tensor,
    prompt_lens: Tensor,
    completion_lens: Tensor,
    prompt_keys: list[Tensor],
) -> Tensor:
    """Pass 3 of `group_shared_hidden`: every row's completion (b, F) on `cache`, which holds
    its group's prompt; `prompt_keys` masks the cached keys each row sees. (b, F, H)."""
    device = input_ids.device
    # The last completion token predicts nothing: it is not fed.
    fed_len = max(int(completion_lens.max()) - 1, 1)
    offsets = torch.arange(fed_len, device=device)  # (F,)
    positions = prompt_lens[:, None] + offsets  # (b, F) absolute positions of the fed tokens
    fed_mask = offsets < completion_lens[:, None] - 1  # (b, F)
    fed_ids = input_ids.gather(1, positions.clamp(max=input_ids.shape[1] - 1))  # (b, F)
    return decoder(
        input_ids=torch.where(fed_mask, fed_ids, 0),
        attention_mask=torch.cat([*prompt_keys, fed_mask], 1).long(),
        position_ids=positions,
        use_cache=True,
        **{cache_kw: cache},
    ).last_hidden_state  # (b, F, H)


def common_prefix_len(prompt_ids: Tensor, prompt_lens: Tensor) -> int:
    """Length of the longest token prefix common to the prompts (g, P) right-padded to lengths
    (g,), at most the shortest prompt less one token: every group keeps a token of its own,
    whose hidden state predicts its first completion token."""
    limit = int(prompt_lens.min()) - 1
    same = (prompt_ids[:, :limit] == prompt_ids[:1, :limit]).all(0)  # (limit,)
    return int(same.long().cumprod(0).sum())


def _check_cache_filled(cache: DynamicCache, expected: int, decoder: nn.Module, kw: str) -> None:
    # A decoder that ignored the cache (an unknown keyword swallowed by **kwargs) would let
    # later tokens attend to nothing of their prompt: wrong log-probs, silently.
    if cache.get_seq_length() != expected:
        raise RuntimeError(
            f"{type(decoder).__name__} did not fill the KV cache passed as `{kw}` "
            f"(holds {cache.get_seq_length()} of {expected} tokens): this transformers "
            "version's cache argument is not supported; set actor.share_prompts=false"
        )


def cache_keyword(decoder: nn.Module) -> str:
    """The keyword under which `decoder.forward` takes a KV cache: `past_key_values` up to
    transformers 5.x, `cache` in later releases. Both are swallowed silently by the other
    version's **kwargs, so the name is read off the signature rather than assumed."""
    params = inspect.signature(decoder.forward).parameters
    for name in ("past_key_values", "cache"):
        if name in params:
            return name
    raise TypeError(
        f"{type(decoder).__name__}.forward takes neither `past_key_values` nor `cache`; "
        "set actor.share_prompts=false"
    )


def check_shared_prompts(
    input_ids: Tensor, attention_mask: Tensor, prompt_lens: Tensor, group_ids: Tensor
) -> None:
    """Raise ValueError unless consecutive rows with the same group id share one prompt.

    GRPO samples a group from one prompt, so this only fails on a caller's bug; it runs on the
    host before the (collective) forward. Also checks 1 <= prompt_len <= the row's length.
    """
    lengths = attention_mask.sum(1)  # (B,)
    bad = ((prompt_lens < 1) | (prompt_lens > lengths)).nonzero()
    if len(bad):
        row = int(bad[0])
        raise ValueError(
            f"row {row}: prompt_len {int(prompt_lens[row])} outside 1..{int(lengths[row])}"
        )
    for row in (group_ids[1:] == group_ids[:-1]).nonzero().squeeze(1).tolist():
        a, b = row, row + 1
        p = int(prompt_lens[a])
        if int(prompt_lens[b]) != p or not torch.equal(input_ids[a, :p], input_ids[b, :p]):
            raise ValueError(
                f"rows {a} and {b} share group id {int(group_ids[a])} but not their prompt "
                f"(lengths {p} and {int(prompt_lens[b])}): a GRPO group samples one prompt; "
                "set actor.share_prompts=false to score rows independently"
            )


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
