"""DistillSparse's share of the memory plan (plan.py): what the sparse policy's adapter holds
beside the dense actor (sparrow/distill, docs/DESIGN.md §1), so that a run with distill on is
planned, fitted and refused with it.

Held all run (`weights`, `state`): the frozen deep copy of the policy the adapter is trained on
(sparse_policy.py: every weight again, in the model's dtype); the LoRA A and B of every targeted
linear in fp32 (peft keeps a bf16/fp16 model's adapter in fp32) with AdamW's m and v; in gated
mode the engine's copy of the factors (`LLMEngine.set_lora`, the engine's dtype).
At the distill step, after the dense update (`step`): the adapter's fp32 gradients and one
micro-batch's forward + backward through the whole copy (distill.micro_batch_size rows; no
activation checkpointing; the fp32 logits, log-softmax and gradient of every completion token of
the micro-batch at once, sparse_policy.token_logprobs); gated with a shared prefix, each group's
prompt runs once without grad (its activations are not kept) and its K/V is indexed out to the
rows. Merged mode (gate=false)
also builds theta + phi for the engine after the step (`merged_state_dict`: every targeted
matrix again), counted as the step's transient when larger.
"""

from dataclasses import dataclass

from sparrow.models.shape import ModelShape
from sparrow.rl.actor_memory import micro_batch_activation_bytes, row_expanded_cache_bytes
from sparrow.train.config import SparrowConfig

# The decoder's linear layers (HF names) and their (in, out) widths: what peft's "all-linear"
# wraps in a Llama/Qwen/Mistral decoder (every linear but the LM head).
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_FP32 = 4
_ADAMW = 8  # m and v, fp32


@dataclass(frozen=True)
class AdapterMemory:
    weights: int = 0  # the frozen copy of theta
    state: int = 0  # LoRA (fp32), its AdamW moments, the engine's factors
    step: int = 0  # the distill step's transient: gradients + one micro-batch, or the merge
    rows: int = 0  # rows of the micro-batch planned
    tokens: int = 0  # its decoder tokens


def targeted_linears(target_modules: str | list[str]) -> tuple[str, ...]:
    """The decoder linears peft wraps for `target_modules` ("all-linear", or module names)."""
    if target_modules == "all-linear":
        return LINEARS
    names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
    return tuple(name for name in LINEARS if name in names)


def lora_parameter_count(shape: ModelShape, rank: int, target_modules: str | list[str]) -> int:
    """LoRA A (rank x in) and B (out x rank) of every targeted linear of every layer."""
    h, q, kv, i = (shape.hidden_size, shape.num_q_heads * shape.head_dim, shape.kv_dim,
                   shape.intermediate_size)  # fmt: skip
    widths = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
              "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}  # fmt: skip
    per_layer = sum(rank * sum(widths[name]) for name in targeted_linears(target_modules))
    return shape.num_layers * per_layer


def adapter_memory(
    cfg: SparrowConfig,
    shape: ModelShape,
    params: int,
    world: int,
    longest_prompt: int | None = None,
    common_prefix: int = 0,
) -> AdapterMemory:
    """DistillSparse's bytes on one rank of `world` (`params`: the model's parameter count,
    plan.parameter_count); all zero when it is not built (distill off, or a dense schedule:
    sparrow.train.build.build_distill)."""
    d = cfg.distill
    if not d.enabled or cfg.schedule.mode == "dense":
        return AdapterMemory()
    model_bytes = _DTYPE_BYTES[cfg.model.dtype]
    lora = lora_parameter_count(shape, d.rank, d.target_modules)
    engine_factors = lora * _DTYPE_BYTES[cfg.rollout.engine.dtype] if d.gate else 0
    prompt = cfg.data.max_prompt_tokens if longest_prompt is None else longest_prompt
    completion = cfg.rollout.max_new_tokens
    rank_rows = -(-cfg.rl.prompts_per_step * cfg.rl.group_size // world)
    rows = min(d.micro_batch_size, rank_rows)
    shared = d.gate and d.share_prefix
    # Shared: each row's prompt (its group's) comes from a no-grad prefix pass, and only the
    # completion (and the prompt's last token) runs with grad; else every row runs whole.
    tokens = rows * (completion + 1 if shared else prompt + completion)
    activations = micro_batch_activation_bytes(
        shape, tokens, checkpointing=False, chunk_tokens=rows * completion,
        bytes_per_value=model_bytes,
    )  # fmt: skip
    prefix_cache = row_expanded_cache_bytes(shape, rows * prompt, model_bytes) if shared else 0
    step = lora * _FP32 + activations + prefix_cache
    if not d.gate:  # theta + phi for the engine: each targeted matrix once more
        step = max(step, targeted_matrix_values(shape, d.target_modules) * model_bytes)
    return AdapterMemory(
        weights=params * model_bytes,
        state=lora * (_FP32 + _ADAMW) + engine_factors,
        step=step,
        rows=rows,
        tokens=tokens,
    )


def targeted_matrix_values(shape: ModelShape, target_modules: str | list[str]) -> int:
    """Values of the targeted linears' weight matrices (what a merge writes anew)."""
    h, q, kv, i = (shape.hidden_size, shape.num_q_heads * shape.head_dim, shape.kv_dim,
                   shape.intermediate_size)  # fmt: skip
    sizes = {"q_proj": h * q, "k_proj": h * kv, "v_proj": h * kv, "o_proj": q * h,
             "gate_proj": h * i, "up_proj": h * i, "down_proj": i * h}  # fmt: skip
    return shape.num_layers * sum(sizes[name] for name in targeted_linears(target_modules))
