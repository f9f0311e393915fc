"""The run's memory plan: the bytes each phase of a step holds at its peak, from the model's shape
and the resolved config, before anything large is allocated.

    plan = plan_memory(cfg, shape, world=1, on_gpu=False, longest_prompt=3500)
    plan.peak_phase(), plan.phases["actor step"]

Engine and actor share one device (on a GPU the trainer moves both there; on CPU both live in host
RAM), so every phase holds what stays resident all run ("resident": the actor's weights and
optimizer state, the engine's weight copy, KV pool and page summaries) plus its own transient:

- prefill peak: one prefill step's activations (the longest prompt, or max_prefill_tokens);
- decode peak: the sampler's fp32 logits of a full batch;
- actor log-probs: a no-grad pass over the actor's largest micro-batch (actor_passes.py: its
  prompts' K/V indexed out to every row included);
- monitor exact (monitor.exact): the same pass over the rows the exact acceptance measures, and
  per row its dense and rollout log-softmax over the vocabulary;
- actor step: gradients plus the micro-batch's activations (sparrow.rl.actor_memory), with shared
  prompts their K/V indexed out to every row (`row_cache`, held `step_copies` times); with
  rl.async.staleness=1 also the next step's draw, which runs beside the update (`overlap`: the
  larger of its prefill and decode transients, and the monitor's dense replay logits of the
  measured rows beside their kept ones).
- distill step (distill.enabled): DistillSparse's update after the dense one, its gradients and
  one micro-batch's forward + backward (adapter.py); its frozen copy of the weights and the
  adapter's state stay resident all run.
With rollout.engine.sleep (rollout/sleep.py) the engine frees its KV pool, page summaries and
dense copies (`asleep`), and at `weights` its weight copy and packed matrices too, through the
actor log-probs, actor step and distill step phases. Not the weights where the speedup probe
re-rolls out after the update (monitor.speedup_every) or theta is frozen (rl.update_policy=false).

On CPU the device is host RAM, which the process itself shares, and three more things live there:
- `runtime`: the process when the plan is made (interpreter, torch, DeepSpeed, transformers, the
  tokenizer, the prompts: 0.5-0.7 GiB for SmolLM2; the weights are memory-mapped from their
  safetensors and not yet read, so they are not in it);
- `packed_weights`: with linear_backend=onednn the engine keeps its matrices re-laid out beside
  the plain ones (sparrow.rollout.linear), one more copy of every matrix it multiplies by;
- `kept_logits`: monitor.exact keeps the measured rows' rollout logits (T x V fp32) in host RAM
  from the rollout until the monitor reads them: across the log-prob pass, or with one dense
  forward (rl.dense_pass=update) across the update, whose forward reads them.
A phase's resident size also exceeds its live bytes: glibc keeps the blocks a phase frees under
its 32 MB mmap threshold (sparrow.malloc), and a later allocation of another size cannot reuse
them all. Two terms count it:
- `HOST_CACHE_COPIES`: each layer's row-expanded prompt K/V is replaced by its concatenation with
  the completions' K/V, a slightly longer tensor that cannot take the freed block, so on the heap
  the expanded cache is held once more than live, in the no-grad passes and in the update; only
  while one layer's expanded K is under the mmap threshold (larger blocks are unmapped on free:
  the long-context exact acceptance's 18 rows x 4036 tokens, 56 MB a layer, are not on the heap);
- `ALLOCATOR_SLACK`: the rest, a share of each phase's transient bytes.

Sizes per value: weights and gradients in the model's dtype; AdamW's m and v in fp32, plus an fp32
master copy when the actor trains in bf16; ZeRO stage >= 1 partitions optimizer state over the
ranks, >= 2 also gradients, 3 also weights; on a GPU, ZeRO-Offload (actor.offload_optimizer,
offload_params) moves the optimizer state (and the weights) to host RAM (offload.py), counted in
`host_offload` apart from the phases. Activation sizes are a sketch (docstrings below);
tests/train/memory/test_plan.py checks them against the GPU rehearsal's live bytes at Qwen3-1.7B,
tests/train/memory/test_measured_peaks.py the CPU plan against both README commands' peak RSS.
"""

from dataclasses import dataclass

import torch

from sparrow.malloc import MMAP_THRESHOLD
from sparrow.models.shape import ModelShape
from sparrow.rl.actor_memory import micro_batch_activation_bytes, row_expanded_cache_bytes
from sparrow.train.config import SparrowConfig
from sparrow.train.memory.actor_passes import (
    actor_micro_batch,
    exact_micro_batch,
    no_grad_pass_bytes,
    step_cache_copies,
)
from sparrow.train.memory.adapter import adapter_memory, lora_parameter_count
from sparrow.train.memory.offload import offload_memory

GiB = 2**30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PHASES = (
    "resident", "prefill peak", "decode peak", "actor log-probs", "monitor exact", "actor step",
    "distill step",
)  # fmt: skip
# Where the trainer has put the engine to sleep (rollout.engine.sleep): the actor's own passes. The
# monitor's exact pass may replay rows on the engine, so it is planned awake.
SLEEPING_PHASES = ("actor log-probs", "actor step", "distill step")
# CPU, see the module docstring. The slack is the smallest share (in steps of 0.05) for which the
# plan covers the worst peaks of `sparrow-bench actor long-prompt` (test_plan.py's
# LONG_PROMPT_GIB: 1-2 groups of 3200-token prompts, a run other than the README's), whose two
# runs per setting differ by up to 2 GiB; tests/train/memory/test_measured_peaks.py then checks
# the README's two commands against it.
HOST_CACHE_COPIES = 1
ALLOCATOR_SLACK = 0.2


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
    logprob_extra: int  # the no-grad pass, its prompts' K/V indexed out to the rows included
    step_activations: int
    row_cache: int  # shared prompts' K/V expanded to the rows, once
    step_copies: float  # of row_cache held at the actor step's peak (step_cache_copies)
    actor_tokens: int  # decoder tokens per actor micro-batch the plan assumed
    actor_expanded: int  # its rows x the longest prompt (shared prompts; a budget bounds both)
    checkpointing: bool
    reference_weights: int = 0  # rl.loss.kl_coef > 0: the initial weights (ZeRO-3: 1/world)
    exact_extra: int = 0  # monitor.exact: the exact acceptance's no-grad pass and per-row work
    runtime: int = 0  # CPU: this process when the plan is made (interpreter, libraries, data)
    packed_weights: int = 0  # CPU engine, linear_backend=onednn: its matrices re-laid out
    kept_logits: int = 0  # CPU, monitor.exact: the measured rows' rollout logits
    slack: float = 0.0  # CPU: ALLOCATOR_SLACK
    overlap: int = 0  # rl.async.staleness=1: the next draw's transient, held during the update
    distill_weights: int = 0  # distill.enabled: the adapter's frozen copy of theta
    adapter_state: int = 0  # distill.enabled: LoRA, its AdamW moments, the engine's factors
    distill_extra: int = 0  # distill.enabled: the distill step's gradients and micro-batch
    distill_rows: int = 0  # rows of the distill micro-batch planned
    asleep: int = 0  # rollout.engine.sleep: what the engine frees through the actor phases
    sleep: str = "off"  # rollout.engine.sleep, for the table
    host_offload: int = 0  # actor.offload_*: the state ZeRO-Offload holds in host RAM (GPU)

    @property
    def engine_resident(self) -> int:
        """What the trainer holds once the engine is built, before the optimizer's state exists:
        both weight copies and the pool (the GPU rehearsal's "engine resident"), and on CPU the
        process's runtime and the engine's packed matrices."""
        engine = self.engine_weights + self.kv_pool + self.page_summaries + self.dense_copies
        own = self.runtime + self.packed_weights
        return self.actor_weights + self.reference_weights + engine + own

    @property
    def transients(self) -> dict[str, int]:
        """Phase -> live bytes it holds above the resident ones (no allocator slack)."""
        out = {
            "resident": 0,
            "prefill peak": self.prefill_extra,
            "decode peak": self.decode_extra + self.kept_logits,
            "actor log-probs": self.logprob_extra + self.kept_logits,
        }
        if self.exact_extra:
            out["monitor exact"] = self.exact_extra + self.kept_logits
        if self.distill_extra:
            out["distill step"] = self.distill_extra
        cache = int(self.step_copies * self.row_cache)
        # rl.dense_pass=update reads the exact rows' kept rollout logits in the update's forward
        # (a separate pass frees them before it: counted anyway, a few hundred MB at most).
        out["actor step"] = (
            self.gradients + self.step_activations + cache + self.kept_logits + self.overlap
        )
        return out

    @property
    def phases(self) -> dict[str, int]:
        """Phase -> bytes held at its peak (the optimizer state and DistillSparse's copy and
        state stay resident throughout)."""
        base = self.engine_resident + self.optimizer + self.distill_weights + self.adapter_state
        phases = {name: base + int(t * (1 + self.slack)) for name, t in self.transients.items()}
        for name in SLEEPING_PHASES:
            if name in phases:
                phases[name] -= self.asleep
        return phases

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
        if self.packed_weights:
            parts.insert(2, ("engine packed weights", self.packed_weights))
        if self.reference_weights:
            parts.insert(1, ("reference weights (KL)", self.reference_weights))
        if self.runtime:
            parts.insert(0, ("process runtime", self.runtime))
        if self.distill_weights:
            parts += [("distill frozen weights", self.distill_weights),
                      ("distill adapter + AdamW", self.adapter_state)]  # fmt: skip
        if self.asleep:
            parts.append((f"engine asleep ({self.sleep})", -self.asleep))
        if self.host_offload:  # not on the device: checked against host RAM (fit.py)
            parts.append(("offloaded to host RAM", self.host_offload))
        lines = [f"memory plan ({device_name}: {device_bytes / GiB:.1f} GiB)", "  parts:"]
        lines += [f"    {name:<26} {value / GiB:8.2f} GiB" for name, value in parts]
        held = "resident: engine resident + optimizer state"
        if self.distill_weights:
            held += " + distill"
        if self.slack:
            held += f"; transients +{self.slack:.0%} allocator slack"
        if self.asleep:
            held += "; the actor phases less the engine asleep"
        lines.append(f"  held at each phase's peak ({held}):")
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


def matrix_count(shape: ModelShape) -> int:
    """Values of the matrices the engine multiplies by (sparrow.rollout.model): each layer's
    q/k/v, o, gate/up and down, and the LM head (the input embedding is only indexed)."""
    h, q_dim = shape.hidden_size, shape.num_q_heads * shape.head_dim
    layer = h * q_dim + 2 * h * shape.kv_dim + q_dim * h + 3 * h * shape.intermediate_size
    return shape.num_layers * layer + shape.vocab_size * h


def prefill_activation_bytes(shape: ModelShape, tokens: int, bytes_per_value: int) -> int:
    """One prefill step of `tokens` new tokens (no autograd): per token, the residual stream, its
    norm, q/k/v, the attention output and its projection (6 H + 2 kv_dim) and the MLP's gate, up,
    activation and product (4 I) of the layer running; logits only at each prompt's last token."""
    per_token = 6 * shape.hidden_size + 2 * shape.kv_dim + 4 * shape.intermediate_size
    return tokens * per_token * bytes_per_value


def actor_micro_batch_tokens(
    cfg: SparrowConfig, longest_prompt: int | None = None, common_prefix: int = 0
) -> tuple[int, str]:
    """Decoder tokens of the actor's largest micro-batch and how they are set (the plan line)."""
    mb = actor_micro_batch(cfg, longest_prompt, common_prefix)
    return mb.decoder_tokens, mb.how


def plan_memory(
    cfg: SparrowConfig,
    shape: ModelShape,
    world: int,
    on_gpu: bool,
    longest_prompt: int | None = None,
    common_prefix: int = 0,
    runtime: int = 0,
) -> MemoryPlan:
    """The plan of one rank of `world` (`on_gpu`: the engine runs its Triton/bf16 path and the
    actor's precision=auto means bf16). Without `longest_prompt`, prompts are taken at
    data.max_prompt_tokens. `runtime`: on CPU, what this process holds already (its RSS)."""
    actor, eng = cfg.actor, cfg.rollout.engine
    params = parameter_count(shape)
    engine_bytes = _DTYPE_BYTES[eng.dtype]
    bf16 = actor.precision == "bf16" or (actor.precision == "auto" and on_gpu)
    actor_weights, optimizer, gradients = _actor_state_bytes(cfg, shape, params, world, bf16)
    offload = offload_memory(cfg, params, on_gpu, bf16, actor_weights, optimizer, gradients)
    triton = on_gpu and eng.backend in ("auto", "triton")
    kv_pool, page_summaries, dense_copies = _engine_cache_bytes(cfg, shape, engine_bytes, triton)
    prompt = cfg.data.max_prompt_tokens if longest_prompt is None else longest_prompt
    mb = actor_micro_batch(cfg, longest_prompt, common_prefix, world)
    value_bytes = 2 if bf16 else 4
    host = not on_gpu  # the device is host RAM: the process and its host-side buffers count
    exact_extra, kept_logits = _exact_monitor_bytes(
        cfg, shape, longest_prompt, common_prefix, world, value_bytes, host
    )
    packed = host and eng.linear_backend == "onednn" and not triton
    row_cache = row_expanded_cache_bytes(shape, mb.expanded_tokens, value_bytes)
    heap_copies = _heap_copies(shape, mb.expanded_tokens, value_bytes) if host else 0
    logprob_extra = no_grad_pass_bytes(shape, mb, actor.logprob_chunk_tokens, value_bytes)
    prefill_extra, decode_extra, overlap = _engine_transients(cfg, shape, prompt, kept_logits)
    checkpointing, chunk = actor.activation_checkpointing, actor.logprob_chunk_tokens
    adapter = adapter_memory(cfg, shape, params, world, longest_prompt, common_prefix)
    return MemoryPlan(
        actor_weights=offload.weights,
        engine_weights=params * engine_bytes,
        optimizer=offload.optimizer,
        gradients=offload.gradients,
        host_offload=offload.host,
        kv_pool=kv_pool,
        page_summaries=page_summaries,
        dense_copies=dense_copies,
        prefill_extra=prefill_extra,
        decode_extra=decode_extra,
        logprob_extra=logprob_extra + heap_copies * row_cache,
        step_activations=micro_batch_activation_bytes(
            shape, mb.decoder_tokens, checkpointing, chunk, value_bytes
        ),
        row_cache=row_cache,
        step_copies=step_cache_copies(shape, actor.activation_checkpointing) + heap_copies,
        actor_tokens=mb.decoder_tokens,
        actor_expanded=mb.expanded_tokens,
        checkpointing=actor.activation_checkpointing,
        # A LoRA run's reference is its own base, the adapter off: no copy.
        reference_weights=actor_weights if cfg.rl.loss.kl_coef and not actor.lora.rank else 0,
        exact_extra=exact_extra,
        runtime=runtime if host else 0,
        packed_weights=matrix_count(shape) * engine_bytes if packed else 0,
        kept_logits=kept_logits,
        slack=ALLOCATOR_SLACK if host else 0.0,
        overlap=overlap,
        distill_weights=adapter.weights,
        adapter_state=adapter.state,
        distill_extra=adapter.step,
        distill_rows=adapter.rows,
        asleep=_asleep_bytes(cfg, kv_pool + page_summaries + dense_copies, params * engine_bytes
                             + (matrix_count(shape) * engine_bytes if packed else 0)),
        sleep=eng.sleep,
    )  # fmt: skip


def _asleep_bytes(cfg: SparrowConfig, cache: int, weights: int) -> int:
    """What the engine's sleep frees through the actor phases: its caches, and at `weights` its
    weight copy (with the packed one) unless an engine pass after the update keeps it (the
    speedup probe) or no push would refill it (a frozen theta)."""
    level = cfg.rollout.engine.sleep
    if level == "off":
        return 0
    keeps_weights = bool(cfg.monitor.speedup_every) or not cfg.rl.update_policy
    return cache + (weights if level == "weights" and not keeps_weights else 0)


def _engine_transients(
    cfg: SparrowConfig, shape: ModelShape, prompt: int, kept_logits: int
) -> tuple[int, int, int]:
    """(prefill, decode, overlap) transient bytes of the engine: one prefill step's activations
    (the longest prompt, or max_prefill_tokens), the sampler's fp32 logits of a full batch, and
    with rl.async.staleness=1 what the next step's draw holds beside the update (its larger
    transient, and the same-weights replay's logits beside the kept ones)."""
    eng = cfg.rollout.engine
    prefill_tokens = max(eng.max_prefill_tokens, prompt)
    prefill = prefill_activation_bytes(shape, prefill_tokens, _DTYPE_BYTES[eng.dtype])
    decode = eng.max_batch_size * shape.vocab_size * 4  # one fp32 logits row per sequence
    overlap = 0
    if cfg.rl.async_rollout.staleness:
        overlap = max(prefill, decode + kept_logits) + kept_logits
    return prefill, decode, overlap


def _actor_state_bytes(
    cfg: SparrowConfig, shape: ModelShape, params: int, world: int, bf16: bool
) -> tuple[int, int, int]:
    """(weights, optimizer, gradients) bytes of the actor on one rank: ZeRO partitions the
    optimizer state from stage 1, the gradients from 2 and the weights from 3 (the reference
    model's weights are held as the actor's). The optimizer keeps fp32 Adam moments, plus an
    fp32 master copy of bf16 weights. With actor.lora only the adapter's `lora` parameters
    train: the optimizer state and gradients are theirs, the weights the base's plus theirs."""
    model_bytes = _DTYPE_BYTES[cfg.model.dtype]
    stage = cfg.actor.zero_stage
    lora = cfg.actor.lora
    trained = lora_parameter_count(shape, lora.rank, lora.modules()) if lora.rank else params

    def share(stage_from: int) -> int:  # ZeRO partitions this state from stage `stage_from` on
        return world if stage >= stage_from else 1

    weights = (params + (trained if lora.rank else 0)) * model_bytes // share(3)
    optimizer = trained * (8 + (4 if bf16 else 0)) // share(1)
    return weights, optimizer, trained * model_bytes // share(2)


def _engine_cache_bytes(
    cfg: SparrowConfig, shape: ModelShape, engine_bytes: int, triton: bool
) -> tuple[int, int, int]:
    """(kv_pool, page_summaries, dense_copies) bytes of the engine's caches: the paged K/V of
    every layer, the score mode's page summaries (in the cache dtype where Triton scores, fp32
    elsewhere) and, on the torch path, the dense layers' contiguous K/V copies."""
    eng = cfg.rollout.engine
    summary_bytes = engine_bytes if triton else 4
    tables = 2 if eng.score == "quest" else 1
    pool_tokens = eng.num_pages * eng.page_size
    dense_copies = 0
    if eng.dense_kv_copy and not triton:
        dense_copies = len(eng.dense_layers) * 2 * pool_tokens * shape.kv_dim * engine_bytes
    kv_pool = shape.num_layers * 2 * pool_tokens * shape.kv_dim * engine_bytes
    page_summaries = shape.num_layers * eng.num_pages * tables * shape.kv_dim * summary_bytes
    return kv_pool, page_summaries, dense_copies


def _exact_monitor_bytes(
    cfg: SparrowConfig,
    shape: ModelShape,
    longest_prompt: int | None,
    common_prefix: int,
    world: int,
    value_bytes: int,
    host: bool,
) -> tuple[int, int]:
    """(exact_extra, kept_logits) of monitor.exact, (0, 0) without it: its own no-grad pass and
    per row the dense logits, log-softmax and the rollout's (C, V) each; on CPU also the rollout
    logits the engine keeps and the row-expanded prompt K/V copied once more on the heap."""
    if not cfg.monitor.exact:
        return 0, 0
    exact = exact_micro_batch(cfg, longest_prompt, common_prefix, world)
    new_tokens = cfg.rollout.max_new_tokens
    vocab_row = shape.vocab_size * 4  # one fp32 logits row
    exact_extra = no_grad_pass_bytes(shape, exact, 0, value_bytes) + 8 * new_tokens * vocab_row
    kept_logits = 0
    if host:  # the engine keeps them on the CPU whatever its device
        kept_logits = exact.rows * new_tokens * vocab_row
        exact_cache = row_expanded_cache_bytes(shape, exact.expanded_tokens, value_bytes)
        exact_extra += _heap_copies(shape, exact.expanded_tokens, value_bytes) * exact_cache
    return exact_extra, kept_logits


def _heap_copies(shape: ModelShape, expanded_tokens: int, bytes_per_value: int) -> int:
    """HOST_CACHE_COPIES when one layer's row-expanded K is a heap block (under glibc's mmap
    threshold, sparrow.malloc), else 0: an unmapped block is returned to the kernel on free."""
    layer_bytes = expanded_tokens * shape.kv_dim * bytes_per_value
    return HOST_CACHE_COPIES if layer_bytes < MMAP_THRESHOLD else 0


def targets_gpu(cfg: SparrowConfig) -> bool:
    """Whether the run is planned for a GPU: one is present, or the config is a GPU one (CUDA
    graphs or the Triton backend asked for), as on a dry run of a GPU preset on a CPU machine."""
    eng = cfg.rollout.engine
    return torch.cuda.is_available() or eng.cuda_graphs or eng.backend == "triton"
