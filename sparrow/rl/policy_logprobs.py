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
Every output is (B, T) aligned to the token it describes (position 0 and padding are 0): the
losses and the monitor read the same tensors in both layouts. Prompt positions are scored once
per group and copied to its rows.
"""

import inspect
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache

Scores = tuple[Tensor, Tensor, Tensor, Tensor]  # LogprobOutput's fields, in its order


class PolicyWithLogprobs(nn.Module):
    """The HF model plus a chunked lm_head, as one module so DeepSpeed's hooks see every call."""

    def __init__(self, lm: nn.Module, chunk_tokens: int):
        super().__init__()
        self.lm = lm
        self.chunk_tokens = chunk_tokens

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        topk: int,
        temperature: float,
        prompt_lens: Tensor | None = None,
        group_ids: Tensor | None = None,
    ) -> Scores:
        """LogprobOutput's fields as a tuple: ZeRO-3's hooks only see tensors in tuples.

        input_ids, attention_mask (b, T), right-padded. With prompt_lens and group_ids (b,),
        consecutive rows with the same group id share their prompt (checked by
        `check_shared_prompts` before the call) and it is computed once.
        """
        if prompt_lens is None or group_ids is None:
            return self._per_row(input_ids, attention_mask, topk, temperature)
        return self._group_shared(
            input_ids, attention_mask, prompt_lens, group_ids, topk, temperature
        )

    def _per_row(
        self, input_ids: Tensor, attention_mask: Tensor, topk: int, temperature: float
    ) -> Scores:
        batch, seq_len = input_ids.shape
        # Right padding: positions past the longest real sequence influence nothing, skip them.
        used_len = max(int(attention_mask.sum(dim=1).max().item()), 1)
        ids = input_ids[:, :used_len]  # (b, L)
        hidden = self.lm.get_decoder()(
            input_ids=ids, attention_mask=attention_mask[:, :used_len].long()
        ).last_hidden_state  # (b, L, H)
        # Hidden state at t - 1 predicts the token at t: targets are positions 1 .. L-1.
        scores = self._score(hidden[:, :-1], ids[:, 1:], topk, temperature)  # (b, L - 1, ...)
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
    ) -> Scores:
        seq_len = input_ids.shape[1]
        device = input_ids.device
        shared = group_shared_hidden(
            self.lm.get_decoder(), input_ids, attention_mask, prompt_lens, group_ids
        )
        prompt_ids = input_ids[shared.first_row, : shared.prompt_hidden.shape[1]]  # (g, P)
        prompt_scores = self._score(
            shared.prompt_hidden[:, :-1], prompt_ids[:, 1:], topk, temperature
        )  # (g, P - 1, ...)
        max_completion = int(shared.completion_lens.max())
        offsets = torch.arange(max_completion, device=device)  # (C,)
        completion_ids = input_ids.gather(
            1, (prompt_lens[:, None] + offsets).clamp(max=seq_len - 1)
        )  # (b, C)
        completion_ids = torch.where(offsets < shared.completion_lens[:, None], completion_ids, 0)
        completion_scores = self._score(
            shared.hidden[:, :max_completion], completion_ids, topk, temperature
        )  # (b, C, ...)
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

    def _score(self, hidden: Tensor, targets: Tensor, topk: int, temperature: float) -> Scores:
        """Scores of `targets` (n, L) from the hidden states predicting them (n, L, H), with at
        most `chunk_tokens` (rows x positions) of logits alive at once."""
        rows, length = targets.shape
        positions_per_chunk = max(1, self.chunk_tokens // max(rows, 1))
        parts = []
        # An empty chunk when L = 0 keeps the output shapes uniform.
        for start in range(0, max(length, 1), positions_per_chunk):
            end = min(start + positions_per_chunk, length)
            args = (hidden[:, start:end], targets[:, start:end], topk, temperature)
            if torch.is_grad_enabled():
                # Recompute the chunk's logits in backward instead of keeping them all alive.
                parts.append(checkpoint(self._score_chunk, *args, use_reentrant=False))
            else:
                parts.append(self._score_chunk(*args))
        return tuple(torch.cat([p[i] for p in parts], dim=1) for i in range(4))

    def _score_chunk(
        self, hidden: Tensor, targets: Tensor, topk: int, temperature: float
    ) -> Scores:
        logits = self.lm.get_output_embeddings()(hidden).float() / temperature  # (n, c, V)
        logprobs = F.log_softmax(logits, dim=-1)  # (n, c, V)
        token_lp = logprobs.gather(-1, targets[..., None]).squeeze(-1)  # (n, c)
        with torch.no_grad():
            entropy = -(logprobs.exp() * logprobs).sum(-1)  # (n, c)
            topk_lp, topk_ids = logprobs.topk(topk, dim=-1)  # (n, c, K)
        return token_lp, topk_ids, topk_lp, entropy


class GroupShared(NamedTuple):
    """What `group_shared_hidden` returns; g groups, b rows."""

    prompt_hidden: Tensor  # (g, P, H) each group's prompt, right-padded to the longest
    hidden: Tensor  # (b, 1 + F, H): column j predicts the row's completion token j
    first_row: Tensor  # (g,) the first row of each group
    row_group: Tensor  # (b,) the group of each row
    completion_lens: Tensor  # (b,)


def group_shared_hidden(
    decoder: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    prompt_lens: Tensor,
    group_ids: Tensor,
) -> GroupShared:
    """Final hidden states of right-padded rows (b, T) whose consecutive rows with the same
    group id share their prompt: the decoder runs once over each group's prompt (g, P) into a KV
    cache, the cache is indexed out to the group's rows (differentiable: the prompt's K/V gets
    every row's gradient) and the completions attend to it.

    Every call makes the same module calls, two decoder passes, the second over at least one
    (then masked) token: ZeRO-3 gathers each module's weights per call, and a rank that skipped
    the second pass (all its completions one token long) would leave the others waiting.
    """
    seq_len = input_ids.shape[1]
    device = input_ids.device
    starts = torch.ones(len(group_ids), dtype=torch.bool, device=device)  # (b,)
    starts[1:] = group_ids[1:] != group_ids[:-1]
    first_row = starts.nonzero().squeeze(1)  # (g,)
    row_group = starts.cumsum(0) - 1  # (b,)
    completion_lens = attention_mask.sum(1) - prompt_lens  # (b,)
    max_prompt = int(prompt_lens.max())
    # The last completion token predicts nothing: it is not fed.
    fed_len = max(int(completion_lens.max()) - 1, 1)

    key_mask = torch.arange(max_prompt, device=device) < prompt_lens[:, None]  # (b, P)
    cache = DynamicCache(config=decoder.config)
    cache_kw = cache_keyword(decoder)
    prompt_hidden = decoder(
        input_ids=input_ids[first_row, :max_prompt],
        attention_mask=key_mask[first_row].long(),
        use_cache=True,
        **{cache_kw: cache},
    ).last_hidden_state  # (g, P, H)
    # A decoder that ignored the cache (an unknown keyword swallowed by **kwargs) would let the
    # completions attend to nothing of their prompt: wrong log-probs, silently.
    if cache.get_seq_length() != max_prompt:
        raise RuntimeError(
            f"{type(decoder).__name__} did not fill the KV cache passed as `{cache_kw}` "
            f"(holds {cache.get_seq_length()} of {max_prompt} prompt tokens): this transformers "
            "version's cache argument is not supported; set actor.share_prompts=false"
        )
    # The last prompt position predicts every row's first completion token.
    last_prompt = prompt_hidden[row_group, prompt_lens - 1]  # (b, H)

    cache.batch_select_indices(row_group)  # the group's prompt K/V for each of its rows
    offsets = torch.arange(fed_len, device=device)  # (F,)
    positions = prompt_lens[:, None] + offsets  # (b, F) absolute positions of the fed tokens
    fed_mask = offsets < completion_lens[:, None] - 1  # (b, F)
    fed_ids = input_ids.gather(1, positions.clamp(max=seq_len - 1))  # (b, F)
    completion = decoder(
        input_ids=torch.where(fed_mask, fed_ids, 0),
        attention_mask=torch.cat([key_mask, fed_mask], 1).long(),
        position_ids=positions,
        use_cache=True,
        **{cache_kw: cache},
    ).last_hidden_state  # (b, F, H)
    hidden = torch.cat([last_prompt[:, None], completion], 1)  # (b, 1 + F, H)
    return GroupShared(prompt_hidden, hidden, first_row, row_group, completion_lens)


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
