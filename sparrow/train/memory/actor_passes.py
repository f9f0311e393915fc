"""The dense model's passes as the memory plan sizes them: the largest micro-batch of the actor's
log-prob pass and update (cut as sparrow.rl.micro_batches cuts it) and of the monitor's exact
acceptance (sparrow.monitor.exact_acceptance), and the bytes a no-grad pass over one holds.

    mb = actor_micro_batch(cfg, longest_prompt=4036, common_prefix=30, world=1)
    mb.decoder_tokens, mb.expanded_tokens, no_grad_pass_bytes(shape, mb, 1024, 4)

With shared prompts (actor.share_prompts) the decoder runs each group's prompt once into a KV cache,
indexes the cache out to the group's rows and runs the completions on it
(sparrow.rl.shared_prompt_passes.group_shared_hidden): a micro-batch's decoder tokens are its
prompts once plus its completions, while every layer holds rows x prompt cached K/V
(`expanded_tokens`). Under a token budget the packing keeps both within the budget, so with long
prompts far fewer decoder tokens than the budget run (6 rows of a 4036-token prompt: 4228 decoder
tokens, 24216 expanded, under a budget of 26112).
"""

from dataclasses import dataclass

from sparrow.models.shape import ModelShape
from sparrow.train.config import SparrowConfig


@dataclass(frozen=True)
class MicroBatch:
    """The largest micro-batch of a pass, at the longest prompt and completion."""

    rows: int
    prompt_tokens: int  # decoder tokens of the prompt passes (whole rows when not shared)
    completion_tokens: int  # decoder tokens of the completions run on the prompts' K/V
    expanded_tokens: int  # shared prompts: rows x the longest prompt, their K/V in every layer
    mask_keys: int  # keys a query of the prompt pass sees at most (its causal mask's width)
    how: str  # how its size is set, for the plan line

    @property
    def decoder_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def actor_micro_batch(
    cfg: SparrowConfig, longest_prompt: int | None = None, common_prefix: int = 0, world: int = 1
) -> MicroBatch:
    """The actor's largest micro-batch (sparrow.rl.micro_batches): by rows, whole groups up to
    micro_batch_size rows (a larger group whole); under a token budget, as many rows as keep the
    padded layout and, with shared prompts, rows x the longest prompt within the budget (a row
    longer than the budget alone). Never more than this rank's rows of a step."""
    actor = cfg.actor
    prompt = cfg.data.max_prompt_tokens if longest_prompt is None else longest_prompt
    group = cfg.rl.group_size
    step_rows = -(-cfg.rl.prompts_per_step // world) * group
    row, budget = prompt + cfg.rollout.max_new_tokens, actor.max_tokens_per_micro_batch
    if budget > 0 and row > budget:
        how = f"token budget {budget}; the longest row runs alone"
        return _rows(cfg, 1, prompt, common_prefix, how)
    if budget > 0 and not actor.share_prompts:
        return _rows(cfg, min(step_rows, budget // row), prompt, common_prefix, "token budget")
    if budget > 0:
        rows = min(step_rows, budget // prompt)
        while rows > 1 and _rows(cfg, rows, prompt, common_prefix, "").decoder_tokens > budget:
            rows -= 1
        how = f"token budget {budget}: {rows} rows of the {prompt}-token prompt"
        return _rows(cfg, rows, prompt, common_prefix, how)
    rows = min(step_rows, max(actor.micro_batch_size, group))
    return _rows(cfg, rows, prompt, common_prefix, f"{actor.micro_batch_size} rows at most")


def _rows(cfg: SparrowConfig, rows: int, prompt: int, prefix: int, how: str) -> MicroBatch:
    """`rows` rows at the longest prompt and completion: with shared prompts each group's prompt
    runs once (under a token budget a split group at each end; by rows whole groups), the common
    prefix once with share_prefix, then every row's completion on their K/V."""
    actor, completion, group = cfg.actor, cfg.rollout.max_new_tokens, cfg.rl.group_size
    if not actor.share_prompts:
        return MicroBatch(rows, rows * (prompt + completion), 0, 0, prompt + completion, how)
    groups = -(-rows // group)
    if actor.max_tokens_per_micro_batch > 0:
        groups += rows % group != 0
    groups = min(groups, rows)
    shared = min(prefix, prompt) if actor.share_prefix else 0
    prompt_tokens = shared + groups * (prompt - shared)
    return MicroBatch(rows, prompt_tokens, rows * completion, rows * prompt, prompt, how)


def exact_micro_batch(
    cfg: SparrowConfig, longest_prompt: int | None, common_prefix: int, world: int
) -> MicroBatch:
    """The exact acceptance's largest micro-batch (sparrow.monitor.exact_acceptance): the rows it
    measures on this rank (every round(1 / exact_fraction)-th and the noise-floor prompts'), in
    micro_batch_size rows (a larger group whole; no token budget), each measured row's group
    prompt run once."""
    mon, group = cfg.monitor, cfg.rl.group_size
    prompts = -(-cfg.rl.prompts_per_step // world)
    stride = max(1, round(1 / mon.exact_fraction))
    floor = 0
    if mon.noise_floor_fraction > 0 and cfg.schedule.mode != "dense":
        floor = min(prompts - 1, max(1, round(mon.noise_floor_fraction * prompts)))
    rows = min(prompts * group, -(-prompts * group // stride) + floor * group)
    rows = min(rows, max(cfg.actor.micro_batch_size, group))
    prompt = cfg.data.max_prompt_tokens if longest_prompt is None else longest_prompt
    shared = min(common_prefix, prompt) if cfg.actor.share_prefix else 0
    prompt_tokens = shared + min(prompts, rows) * (prompt - shared)
    completion = rows * cfg.rollout.max_new_tokens
    return MicroBatch(rows, prompt_tokens, completion, rows * prompt, prompt, "")


def no_grad_pass_bytes(
    shape: ModelShape, mb: MicroBatch, logit_tokens: int, bytes_per_value: int
) -> int:
    """Peak of a no-grad pass over `mb` (group_shared_hidden, then the LM head), the largest of
    its three stages:
    1. the prompts into the KV cache: every layer's K/V of them, one layer's activations (the
       prefill sketch plus the layer's input and output), HF's boolean causal mask;
    2. the cache indexed out to the rows (`expanded_tokens`) and the completions run on it,
       appending their own K/V: every layer's K/V of both, one layer's held twice more while it
       is indexed and concatenated and once per query head for attention (GQA repeat), one
       layer's activations of the completions, the prompts' final hidden states, the mask;
    3. the LM head over `logit_tokens` positions at once: fp32 logits, log-softmax, their exp
       and product (the entropy)."""
    h, kv = shape.hidden_size, shape.kv_dim
    per_layer = 12 * h + 4 * shape.intermediate_size + 2 * kv  # values per token
    every_layer = shape.num_layers * 2 * kv
    mask = mb.prompt_tokens * mb.mask_keys  # one byte per (query, key)
    prompts = mb.prompt_tokens * (every_layer + per_layer) * bytes_per_value + mask
    cached = mb.expanded_tokens + mb.completion_tokens  # (b, P + C) keys in every layer
    q_dim = shape.num_q_heads * shape.head_dim
    one_layer = 2 * 2 * kv * cached + 2 * q_dim * cached
    values = cached * every_layer + one_layer + mb.completion_tokens * per_layer
    values += mb.prompt_tokens * h
    keys = mb.mask_keys + mb.completion_tokens // max(mb.rows, 1)
    completions = values * bytes_per_value + mb.completion_tokens * keys
    logits = 4 * logit_tokens * shape.vocab_size * 4
    return max(prompts, completions, logits)


def step_cache_copies(shape: ModelShape, checkpointing: bool) -> float:
    """Copies of the row-expanded prompt K/V a training step holds at its peak. Attention runs
    with a key mask, so each layer repeats its K/V over the query heads (GQA; n_rep =
    num_q_heads / num_kv_heads). Without checkpointing every layer keeps that repeat for its
    backward beside the cache itself: 1 + n_rep (SmolLM2, n_rep 3: 4, the count calibrated
    before). With checkpointing the replay keeps the cache as each layer found it and as it
    left it, one layer repeats during its replay, and the gradients of every layer's expanded
    cache accumulate: the index that expanded them was recorded before the completions' pass, so
    autograd runs its backward (the sum back to each prompt) only after that whole pass's:
    3 + n_rep / num_layers (the long-context update measured 10.53 GiB at step 1 against 10.14
    planned with 2, tests/train/memory/test_measured_peaks.py)."""
    n_rep = shape.num_q_heads / shape.num_kv_heads
    return 3 + n_rep / shape.num_layers if checkpointing else 1 + n_rep
