"""The actor's activation memory for one micro-batch: an estimate for the plan line, so that a
long-context run can be sized before it runs out of memory.

Per decoder token, counted in values of the compute dtype (a sketch of what autograd keeps for
one Llama/Qwen3 layer: norm and projection inputs, q/k/v, attention output, the MLP's gate, up,
activation and product), about 10 H + 4 I + 2 kv_dim per layer, and the K/V cache. Without
checkpointing every layer keeps all of it; with checkpointing only each layer's input (H) stays,
plus one layer's activations and their gradients during its replay. The chunked lm_head adds
`chunk_tokens` x vocab fp32 logits, log-softmax and gradient. Weights, gradients and optimizer
states are not included (they do not depend on the micro-batch).

With shared prompts the actor runs each prompt once, then indexes its K/V cache out to every row
of the group before the completions run (sparrow.rl.shared_prompt_passes.group_shared_hidden): every
layer holds rows x prompt cached K/V, not one prompt's (`row_expanded_cache_bytes`). At a 4K
prompt and 48 rows that is 8 GiB of SmolLM2 fp32 cache that the per-token count misses.
"""

from sparrow.models.shape import ModelShape


def micro_batch_activation_bytes(
    shape: ModelShape,
    tokens: int,
    checkpointing: bool,
    chunk_tokens: int,
    bytes_per_value: int = 2,
) -> int:
    """Estimated peak activation bytes of a forward + backward over `tokens` decoder tokens."""
    per_layer = 10 * shape.hidden_size + 4 * shape.intermediate_size + 2 * shape.kv_dim  # /token
    cache = shape.num_layers * 2 * shape.kv_dim  # the shared prompt's K/V, kept for completions
    if checkpointing:
        kept = shape.num_layers * shape.hidden_size + 2 * per_layer + cache
    else:
        kept = shape.num_layers * per_layer + cache
    logits = 3 * chunk_tokens * shape.vocab_size * 4  # fp32 logits, log-softmax and gradient
    return tokens * kept * bytes_per_value + logits


def micro_batch_decoder_tokens(
    rows: int,
    group_size: int,
    prompt: int,
    completion: int,
    common_prefix: int = 0,
    share_prompts: bool = True,
    share_prefix: bool = True,
) -> int:
    """Decoder tokens of a micro-batch of `rows` rows at the longest `prompt` and `completion`.

    With shared prompts each group's prompt runs once (a micro-batch of whole groups, plus one
    split group); with a shared prefix the `common_prefix` tokens that every prompt starts with
    run once per micro-batch (sparrow.rl.policy_logprobs)."""
    if not share_prompts:
        return rows * (prompt + completion)
    groups = -(-rows // group_size) + (rows % group_size != 0)  # a split group at each end
    groups = min(groups, rows)
    prefix = min(common_prefix, prompt) if share_prefix else 0
    return prefix + groups * (prompt - prefix) + rows * completion


LOGPROB_COPIES = 2  # of the row-expanded prompt K/V held at the log-prob pass's peak
STEP_COPIES = 4  # and at a training step's


def row_expanded_cache_bytes(
    shape: ModelShape, expanded_tokens: int, bytes_per_value: int = 2
) -> int:
    """Bytes of the shared prompts' K/V indexed out to their rows, `expanded_tokens` = sum over
    the micro-batch's rows of its (padded) prompt length, held once. The no-grad log-prob pass
    holds it LOGPROB_COPIES times (the expanded K/V and its concatenation with the completions'),
    a training step STEP_COPIES times (those and their gradients): counts calibrated on
    SmolLM2-135M fp32 with 6 rows x 3200-token prompts per group (`sparrow-bench actor
    long-prompt`, checked in tests/train/memory/test_plan.py), where each further group added
    0.4-0.7 GiB to the log-prob pass's peak RSS and 2.1-3.8 GiB to the step's, against 0.82 GiB
    of this term."""
    per_token = shape.num_layers * 2 * shape.kv_dim * bytes_per_value
    return expanded_tokens * per_token
