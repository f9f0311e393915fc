"""The group-shared layout's decoder passes (rl/policy_logprobs.py): each GRPO group's prompt
runs once into a KV cache (after the micro-batch's common token prefix, once), the cache is
indexed out to the group's rows, and the completions attend to it. Also what checks that a
micro-batch's rows may share their prompts, and the KV-cache keyword of the installed
transformers (it changed between releases; a swallowed keyword gives wrong log-probs)."""

import inspect
from typing import NamedTuple

import torch
from torch import Tensor, nn
from transformers import DynamicCache, PreTrainedModel


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
