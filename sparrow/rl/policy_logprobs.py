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
        batch, seq_len = input_ids.shape
        device = input_ids.device
        starts = torch.ones(batch, dtype=torch.bool, device=device)  # (b,) first row of a group
        starts[1:] = group_ids[1:] != group_ids[:-1]
        first_row = starts.nonzero().squeeze(1)  # (g,)
        row_group = starts.cumsum(0) - 1  # (b,) the group of each row
        completion_lens = attention_mask.sum(1) - prompt_lens  # (b,)
        max_prompt = int(prompt_lens.max())
        max_completion = int(completion_lens.max())
        decoder = self.lm.get_decoder()

        # Each group's prompt once; rows of shorter prompts are right-padded (masked keys).
        prompt_ids = input_ids[first_row, :max_prompt]  # (g, P)
        prompt_key_mask = torch.arange(max_prompt, device=device) < prompt_lens[:, None]  # (b, P)
        cache = DynamicCache(config=decoder.config)
        prompt_hidden = decoder(
            input_ids=prompt_ids,
            attention_mask=prompt_key_mask[first_row].long(),
            cache=cache,
            use_cache=True,
        ).last_hidden_state  # (g, P, H)
        prompt_scores = self._score(
            prompt_hidden[:, :-1], prompt_ids[:, 1:], topk, temperature
        )  # (g, P - 1, ...)
        # The prompt's last hidden state predicts each row's first completion token.
        last_prompt = prompt_hidden[row_group, prompt_lens - 1]  # (b, H)

        offsets = torch.arange(max_completion, device=device)  # (C,)
        positions = prompt_lens[:, None] + offsets  # (b, C) absolute positions
        completion_mask = offsets < completion_lens[:, None]  # (b, C)
        completion_ids = input_ids.gather(1, positions.clamp(max=seq_len - 1))  # (b, C)
        completion_ids = torch.where(completion_mask, completion_ids, 0)
        hidden = last_prompt[:, None]  # (b, 1, H)
        if max_completion > 1:
            # Indexing the cache out to rows keeps autograd: the prompt's KV gets every row's
            # gradient. Only the last completion token predicts nothing: leave it out.
            cache.batch_select_indices(row_group)
            completion_hidden = decoder(
                input_ids=completion_ids[:, :-1],
                attention_mask=torch.cat([prompt_key_mask, completion_mask[:, :-1]], 1).long(),
                position_ids=positions[:, :-1],
                cache=cache,
                use_cache=True,
            ).last_hidden_state  # (b, C - 1, H)
            hidden = torch.cat([hidden, completion_hidden], 1)  # (b, C, H)
        completion_scores = self._score(
            hidden[:, :max_completion], completion_ids, topk, temperature
        )  # (b, C, ...)

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
                "set deepspeed.share_prompts=false to score rows independently"
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
