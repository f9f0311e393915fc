"""The run's memory plan: the bytes each phase of a step holds at its peak, from the model's shape
and the resolved config, before anything large is allocated.

    plan = plan_memory(cfg, shape, world=1, on_gpu=False, longest_prompt=3500)
    plan.peak_phase(), plan.phases["actor step"]

Engine and actor share one device (on a GPU the trainer moves both there; on CPU both live in host
RAM), so every phase holds what stays resident all run ("resident": the actor's weights and
optimizer state, the engine's weight copy, KV pool and page summaries) plus its own transient:

- prefill peak: one prefill step's activations (the longest prompt, or max_prefill_tokens);
- decode peak: the sampler's fp32 logits of a full batch;
- actor log-probs: a no-grad forward of one micro-batch (one layer's activations, the causal
  mask, the lm_head chunk);
- actor step: gradients plus the micro-batch's activations (sparrow.rl.actor_memory);
- both actor phases: with shared prompts, the prompts' K/V indexed out to every row (`row_cache`).

Sizes per value: weights and gradients in the model's dtype; AdamW's m and v in fp32, plus an fp32
master copy when the actor trains in bf16; ZeRO stage >= 1 partitions optimizer state over the
ranks, >= 2 also gradients, 3 also weights. Activation sizes are a sketch (docstrings below);
tests/train/memory/test_plan.py checks them against the GPU rehearsal's live bytes at Qwen3-1.7B.
"""

from dataclasses import dataclass

import torch

from sparrow.models.shape import ModelShape
from sparrow.rl.actor_memory import (
    LOGPROB_COPIES,
    STEP_COPIES,
    micro_batch_activation_bytes,
    micro_batch_decoder_tokens,
    row_expanded_cache_bytes,
)
from sparrow.train.config import SparrowConfig

GiB = 2**30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PHASES = ("resident", "prefill peak", "decode peak", "actor log-probs", "actor step")


@dataclass(frozen=True)
class MemoryPlan:
    actor_weights: int
    engine_weights: int
    optimizer: int  # AdamW m, v (and fp32 master), this rank's partition
    gradients: int  # this rank's partition, held during the actor step
    kv_pool: int
    page_summaries: int
    dense_copies: int  # CPU torch backend: the dense layers' contiguous K/V (at most)
    prefill_extra: int
    decode_extra: int
    logprob_extra: int
    step_activations: int
    row_cache: int  # shared prompts' K/V expanded to the rows, once (held in copies)
    actor_tokens: int  # decoder tokens per actor micro-batch the plan assumed
    checkpointing: bool
    reference_weights: int = 0  # rl.loss.kl_coef > 0: the initial weights (ZeRO-3: 1/world)

    @property
    def engine_resident(self) -> int:
        """What the trainer holds once the engine is built, before the optimizer's state exists:
        both weight copies and the pool (the GPU rehearsal's "engine resident")."""
        engine = self.engine_weights + self.kv_pool + self.page_summaries + self.dense_copies
        return self.actor_weights + self.reference_weights + engine

    @property
    def phases(self) -> dict[str, int]:
        """Phase -> bytes held at its peak (the optimizer state stays resident throughout)."""
        base = self.engine_resident + self.optimizer
        return {
            "resident": base,
            "prefill peak": base + self.prefill_extra,
            "decode peak": base + self.decode_extra,
            "actor log-probs": base + self.logprob_extra + LOGPROB_COPIES * self.row_cache,
            "actor step": base
            + self.gradients
            + self.step_activations
            + STEP_COPIES * self.row_cache,
        }

    def peak_phase(self) -> tuple[str, int]:
        return max(self.phases.items(), key=lambda kv: kv[1])

    def table(self, device_bytes: int, device_name: str) -> str:
        """The per-phase table printed by a dry run, against the device's memory."""
        parts = [
            ("actor weights", self.actor_weights),
            ("engine weights", self.engine_weights),
            ("KV pool + page summaries", self.kv_pool + self.page_summaries + self.dense_copies),
            ("engine resident", self.engine_resident),
            ("optimizer state", self.optimizer),
        ]
        if self.reference_weights:
            parts.insert(1, ("reference weights (KL)", self.reference_weights))
        lines = [f"memory plan ({device_name}: {device_bytes / GiB:.1f} GiB)", "  parts:"]
        lines += [f"    {name:<26} {value / GiB:8.2f} GiB" for name, value in parts]
        lines.append("  held at each phase's peak (resident: engine resident + optimizer state):")
        lines += [f"    {name:<26} {value / GiB:8.2f} GiB" for name, value in self.phases.items()]
        return "\n".join(lines)


def parameter_count(shape: ModelShape) -> int:
    """Weights of a decoder of sparrow.models.families: embedding (and an untied LM head),
    attention (with its q/k/v and o biases), gated MLP, norms (Qwen3's per-head q/k norms too)."""
    h, q_dim = shape.hidden_size, shape.num_q_heads * shape.head_dim
    attention = h * q_dim + 2 * h * shape.kv_dim + q_dim * h
    attention += (q_dim + 2 * shape.kv_dim) * shape.qkv_bias + h * shape.o_bias
    layer = attention + 3 * h * shape.intermediate_size + 2 * h
    if shape.qk_norm:
        layer += 2 * shape.head_dim
    heads = 1 if shape.tied_embeddings else 2
    return shape.num_layers * layer + heads * shape.vocab_size * h + h


def prefill_activation_bytes(shape: ModelShape, tokens: int, bytes_per_value: int) -> int:
    """One prefill step of `tokens` new tokens (no autograd): per token, the residual stream, its
    norm, q/k/v, the attention output and its projection (6 H + 2 kv_dim) and the MLP's gate, up,
    activation and product (4 I) of the layer running; logits only at each prompt's last token."""
    per_token = 6 * shape.hidden_size + 2 * shape.kv_dim + 4 * shape.intermediate_size
    return tokens * per_token * bytes_per_value


def logprob_pass_bytes(
    shape: ModelShape,
    tokens: int,
    row_tokens: int,
    prompt_tokens: int,
    chunk_tokens: int,
    bytes_per_value: int,
) -> int:
    """A no-grad forward of `tokens` decoder tokens in rows of at most `row_tokens`: the
    residual stream in and out of a layer and one layer's activations (the training sketch of
    sparrow.rl.actor_memory, without the other layers), the shared prompt's K/V in every layer
    (the completions attend to it), HF's boolean causal mask (each query over at most a row's
    keys), and the lm_head chunk's fp32 logits, log-softmax and top-K work."""
    per_layer = 12 * shape.hidden_size + 4 * shape.intermediate_size + 2 * shape.kv_dim
    cache = min(prompt_tokens, tokens) * shape.num_layers * 2 * shape.kv_dim
    logits = 3 * chunk_tokens * shape.vocab_size * 4
    values = tokens * per_layer + cache
    return values * bytes_per_value + tokens * min(tokens, row_tokens) + logits


def actor_micro_batch_tokens(
    cfg: SparrowConfig, longest_prompt: int | None = None, common_prefix: int = 0
) -> tuple[int, str]:
    """Decoder tokens of the actor's largest micro-batch and how they are set: the token budget
    (a row longer than it runs alone), or micro_batch_size rows at the longest prompt and
    completion, prompts and their common prefix run once as the actor does."""
    actor = cfg.actor
    prompt = cfg.data.max_prompt_tokens if longest_prompt is None else longest_prompt
    row = prompt + cfg.rollout.max_new_tokens
    budget = actor.max_tokens_per_micro_batch
    if budget > 0:
        if row > budget:
            return row, f"token budget {budget}; the longest row runs alone"
        return budget, "token budget"
    tokens = micro_batch_decoder_tokens(
        actor.micro_batch_size,
        cfg.rl.group_size,
        prompt,
        cfg.rollout.max_new_tokens,
        common_prefix,
        actor.share_prompts,
        actor.share_prefix,
    )
    return tokens, f"{actor.micro_batch_size} rows at most"


def actor_expanded_prompt_tokens(
    cfg: SparrowConfig, world: int, longest_prompt: int | None = None
) -> int:
    """Prompt tokens of the largest micro-batch once indexed out to its rows (shared prompts
    only): rows x the longest prompt, the rows being micro_batch_size (a group larger than it
    runs whole); under a token budget the packing keeps rows x prompt within the budget
    (sparrow.rl.micro_batches), the longest row alone excepted. Never more than this rank's rows
    of a step."""
    actor = cfg.actor
    if not actor.share_prompts:
        return 0
    prompt = cfg.data.max_prompt_tokens if longest_prompt is None else longest_prompt
    group = cfg.rl.group_size
    step_rows = -(-cfg.rl.prompts_per_step // world) * group
    if actor.max_tokens_per_micro_batch > 0:
        return min(max(prompt, actor.max_tokens_per_micro_batch), step_rows * prompt)
    return min(max(actor.micro_batch_size, group), step_rows) * prompt


def plan_memory(
    cfg: SparrowConfig,
    shape: ModelShape,
    world: int,
    on_gpu: bool,
    longest_prompt: int | None = None,
    common_prefix: int = 0,
) -> MemoryPlan:
    """The plan of one rank of `world` (`on_gpu`: the engine runs its Triton/bf16 path and the
    actor's precision=auto means bf16). Without `longest_prompt`, prompts are taken at
    data.max_prompt_tokens."""
    actor, eng = cfg.actor, cfg.rollout.engine
    params = parameter_count(shape)
    model_bytes = _DTYPE_BYTES[cfg.model.dtype]
    engine_bytes = _DTYPE_BYTES[eng.dtype]
    bf16 = actor.precision == "bf16" or (actor.precision == "auto" and on_gpu)
    stage = actor.zero_stage

    def share(stage_from: int) -> int:  # ZeRO partitions this state from stage `stage_from` on
        return world if stage >= stage_from else 1

    optimizer = params * (8 + (4 if bf16 else 0)) // share(1)
    triton = on_gpu and eng.backend in ("auto", "triton")
    summary_bytes = engine_bytes if triton else 4
    tables = 2 if eng.score == "quest" else 1
    pool_tokens = eng.num_pages * eng.page_size
    dense_copies = 0
    if eng.dense_kv_copy and not triton:
        dense_copies = len(eng.dense_layers) * 2 * pool_tokens * shape.kv_dim * engine_bytes
    prompt = cfg.data.max_prompt_tokens if longest_prompt is None else longest_prompt
    tokens, _ = actor_micro_batch_tokens(cfg, longest_prompt, common_prefix)
    value_bytes = 2 if bf16 else 4
    return MemoryPlan(
        actor_weights=params * model_bytes // share(3),
        engine_weights=params * engine_bytes,
        optimizer=optimizer,
        gradients=params * model_bytes // share(2),
        kv_pool=shape.num_layers * 2 * pool_tokens * shape.kv_dim * engine_bytes,
        page_summaries=shape.num_layers * eng.num_pages * tables * shape.kv_dim * summary_bytes,
        dense_copies=dense_copies,
        prefill_extra=prefill_activation_bytes(
            shape, max(eng.max_prefill_tokens, prompt), engine_bytes
        ),
        decode_extra=eng.max_batch_size * shape.vocab_size * 4,
        logprob_extra=logprob_pass_bytes(
            shape,
            tokens,
            prompt + cfg.rollout.max_new_tokens,
            prompt,
            actor.logprob_chunk_tokens,
            value_bytes,
        ),  # fmt: skip
        step_activations=micro_batch_activation_bytes(
            shape, tokens, actor.activation_checkpointing, actor.logprob_chunk_tokens, value_bytes
        ),
        row_cache=row_expanded_cache_bytes(
            shape, actor_expanded_prompt_tokens(cfg, world, longest_prompt), value_bytes
        ),
        actor_tokens=tokens,
        checkpointing=actor.activation_checkpointing,
        reference_weights=params * model_bytes // share(3) if cfg.rl.loss.kl_coef else 0,
    )


def targets_gpu(cfg: SparrowConfig) -> bool:
    """Whether the run is planned for a GPU: one is present, or the config is a GPU one (CUDA
    graphs or the Triton backend asked for), as on a dry run of a GPU preset on a CPU machine."""
    eng = cfg.rollout.engine
    return torch.cuda.is_available() or eng.cuda_graphs or eng.backend == "triton"
