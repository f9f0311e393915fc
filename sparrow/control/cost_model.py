"""Decode cost model: Kinetics-style effective FLOPs of dense vs block-sparse rollouts.

eFLOPs = compute FLOPs + I x memory bytes, with I the hardware's FLOPs per byte (~206 on H200:
989 TFLOP/s bf16 / 4.8 TB/s), so memory-bound decode is priced by what it reads (Kinetics,
arXiv 2506.05333; Sparrow's cost model). One decode step of a batch of B sequences, each attending
over L context tokens, costs:
- linear layers (all layers' projections + MLP + LM head, P parameters): 2 P B FLOPs; the weights
  are read once per step, P x dtype bytes, shared by the batch;
- attention per layer and sequence over n tokens: 4 H_q D n FLOPs (QK and PV), 2 H_kv D n x dtype
  bytes of K and V. Dense layers (the first `num_dense_layers`) read n = L; sparse layers read
  n = min(budget_pages x page_size, L) plus the page summaries of all ceil(L / page_size) pages
  (`summary_vectors_per_page` key vectors per KV head, scored by every query head).
Prefill is not counted (it is dense either way), and each of the L_out generated tokens counts as
one decode step: the token at absolute position t attends over t tokens, as in schedule.py.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sparrow.control.schedule import BudgetSchedule
from sparrow.models.shape import ModelShape


def weights_read(shape: ModelShape) -> int:
    """Weights read per decode step (norms and the embedding gather are negligible)."""
    attn = shape.hidden_size * shape.head_dim * (2 * shape.num_q_heads + 2 * shape.num_kv_heads)
    mlp = 3 * shape.hidden_size * shape.intermediate_size
    return shape.num_layers * (attn + mlp) + shape.vocab_size * shape.hidden_size


@dataclass
class CostConfig:
    page_size: int  # tokens per KV page: the engine's (rollout.engine.page_size)
    flops_per_byte: float = 206.0  # I: hardware FLOPs per byte of memory traffic (H200 ~206)
    num_dense_layers: int = 2  # leading layers that stay dense (Sparrow: layers 0 and 1)
    summary_vectors_per_page: int = 1  # key vectors per page summary: 1 mean key, 2 Quest min/max
    dtype_bytes: int = 2  # bytes per weight, KV and summary element (bf16)


def engine_cost_config(page_size: int, num_dense_layers: int, dtype: str) -> CostConfig:
    """The cost model of the engine that rolls out, from its page size, its number of dense
    layers and its dtype name (bf16 on the GPU presets reads half the bytes of the CPU default's
    fp32)."""
    dtype_bytes = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return CostConfig(page_size, num_dense_layers=num_dense_layers, dtype_bytes=dtype_bytes)


@dataclass
class DecodeCost:
    compute_flops: float  # summed over the decode steps
    memory_bytes: float  # summed over the decode steps
    eflops: float  # compute_flops + I * memory_bytes


def decode_cost(
    shape: ModelShape,
    prompt_tokens: int,
    output_tokens: int,
    batch_size: int,
    schedule: BudgetSchedule | None,
    cfg: CostConfig,
) -> DecodeCost:
    """Cost of decoding `output_tokens` tokens after `prompt_tokens` for `batch_size` sequences;
    `schedule` None is dense attention in every layer."""
    num_dense = min(cfg.num_dense_layers, shape.num_layers) if schedule else shape.num_layers
    num_sparse = shape.num_layers - num_dense
    attn_flops_per_token = 4 * shape.num_q_heads * shape.head_dim  # QK and PV, per layer
    kv_bytes_per_token = 2 * shape.kv_dim * cfg.dtype_bytes  # per layer
    summary_bytes = cfg.summary_vectors_per_page * shape.kv_dim * cfg.dtype_bytes  # page, layer
    summary_flops = 2 * cfg.summary_vectors_per_page * shape.num_q_heads * shape.head_dim

    read_tokens = 0  # per sequence, summed over steps and layers
    summary_pages = 0  # per sequence, summed over steps and sparse layers
    for t in range(prompt_tokens, prompt_tokens + output_tokens):
        read_tokens += num_dense * t
        if num_sparse and schedule is not None:  # a schedule whenever some layer is sparse
            pages = -(-t // cfg.page_size)
            read_tokens += num_sparse * min(schedule.budget_pages(t) * cfg.page_size, t)
            summary_pages += num_sparse * pages
    params = weights_read(shape)
    compute = batch_size * (
        output_tokens * 2 * params
        + read_tokens * attn_flops_per_token
        + summary_pages * summary_flops
    )
    memory = output_tokens * params * cfg.dtype_bytes + batch_size * (
        read_tokens * kv_bytes_per_token + summary_pages * summary_bytes
    )
    return DecodeCost(float(compute), float(memory), compute + cfg.flops_per_byte * memory)


def predicted_speedup(
    shape: ModelShape,
    prompt_tokens: int,
    output_tokens: int,
    batch_size: int,
    schedule: BudgetSchedule | None,
    cfg: CostConfig,
) -> float:
    """Dense eFLOPs / schedule eFLOPs for the same decode work."""
    dense = decode_cost(shape, prompt_tokens, output_tokens, batch_size, None, cfg)
    sparse = decode_cost(shape, prompt_tokens, output_tokens, batch_size, schedule, cfg)
    return dense.eflops / sparse.eflops


# ---- speculative rounds (rollout.speculative: the sparse policy drafts, the dense one verifies)


def expected_tokens_per_round(acceptance: float, draft_tokens: int) -> float:
    """E[tokens one sequence's round emits] = sum_{i=0..k} a^i = (1 - a^(k+1)) / (1 - a): the
    accepted drafts and the residual or bonus token after them, each draft kept with
    probability a given the ones before (Leviathan et al. 2023, arXiv 2211.17192, eq. 1)."""
    a, k = acceptance, draft_tokens
    if not 0.0 <= a <= 1.0 or k < 1:
        raise ValueError(f"acceptance must be in [0, 1] and draft_tokens >= 1, got {a}, {k}")
    return float(k + 1) if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def verify_cost(
    shape: ModelShape, context_tokens: int, new_tokens: int, batch_size: int, cfg: CostConfig
) -> DecodeCost:
    """One dense pass over `new_tokens` positions per sequence (a round's input token and its
    drafts): query i produces the token at `context_tokens` + i and attends over that many
    tokens in every layer; the weights and each layer's K/V are read once for all of them (a
    chunked prefill over the cached context). The rewritten K/V of the new positions are
    writes of new_tokens vectors a layer, left out as decode_cost leaves out its one."""
    attn_flops_per_token = 4 * shape.num_q_heads * shape.head_dim
    kv_bytes_per_token = 2 * shape.kv_dim * cfg.dtype_bytes
    attended = sum(context_tokens + i for i in range(new_tokens))  # per layer and sequence
    params = weights_read(shape)
    compute = batch_size * (
        new_tokens * 2 * params + shape.num_layers * attended * attn_flops_per_token
    )
    read = context_tokens + new_tokens - 1  # the last query's context: every key read once
    memory = params * cfg.dtype_bytes + batch_size * shape.num_layers * read * kv_bytes_per_token
    return DecodeCost(float(compute), float(memory), compute + cfg.flops_per_byte * memory)


def speculative_round_cost(
    shape: ModelShape,
    context_tokens: int,
    draft_tokens: int,
    batch_size: int,
    schedule: BudgetSchedule | None,
    cfg: CostConfig,
) -> DecodeCost:
    """One round at `context_tokens`: k sparse decode steps under `schedule` (the drafts at
    context_tokens .. + k - 1) and one dense verify of the k + 1 positions after them."""
    k = draft_tokens
    draft = decode_cost(shape, context_tokens, k, batch_size, schedule, cfg)
    verify = verify_cost(shape, context_tokens, k + 1, batch_size, cfg)
    compute = draft.compute_flops + verify.compute_flops
    memory = draft.memory_bytes + verify.memory_bytes
    return DecodeCost(compute, memory, draft.eflops + verify.eflops)


def speculative_tokens_per_eflop(
    shape: ModelShape,
    context_tokens: int,
    draft_tokens: int,
    batch_size: int,
    schedule: BudgetSchedule | None,
    acceptance: float,
    cfg: CostConfig,
) -> float:
    """Expected tokens a round emits over the round's eFLOPs, per sequence of the batch: the
    throughput the controller's `throughput` objective maximises."""
    cost = speculative_round_cost(shape, context_tokens, draft_tokens, batch_size, schedule, cfg)
    tokens = batch_size * expected_tokens_per_round(acceptance, draft_tokens)
    return tokens / cost.eflops


def speculative_speedup(
    shape: ModelShape,
    context_tokens: int,
    draft_tokens: int,
    batch_size: int,
    schedule: BudgetSchedule | None,
    acceptance: float,
    cfg: CostConfig,
) -> float:
    """Expected speculative tokens/s over dense decode's at `context_tokens`: dense decode's
    eFLOPs per token (over the round's k + 1 positions) times the round's tokens per eFLOP."""
    k = draft_tokens
    dense = decode_cost(shape, context_tokens, k + 1, batch_size, None, cfg).eflops
    per_token = dense / (batch_size * (k + 1))
    rate = speculative_tokens_per_eflop(
        shape, context_tokens, k, batch_size, schedule, acceptance, cfg
    )
    return per_token * rate


def predicted_speculative_speedup(
    shape: ModelShape,
    prompt_tokens: int,
    output_tokens: int,
    batch_size: int,
    schedule: BudgetSchedule,
    draft_tokens: int,
    acceptance: Callable[[int], float],
    cfg: CostConfig,
) -> float:
    """Dense eFLOPs over speculative eFLOPs for decoding `output_tokens` after `prompt_tokens`:
    rounds from the prompt on, each at the acceptance `acceptance(context_tokens)` of its
    position (the step's measured per-bin mean), advancing by its expected tokens."""
    dense = decode_cost(shape, prompt_tokens, output_tokens, batch_size, None, cfg).eflops
    spec, t, end = 0.0, float(prompt_tokens), prompt_tokens + output_tokens
    while t < end:
        context = int(t)
        a = acceptance(context)
        per_round = expected_tokens_per_round(a, draft_tokens)
        cost = speculative_round_cost(shape, context, draft_tokens, batch_size, schedule, cfg)
        emitted = min(per_round, end - t)  # the last round counts the share it still needs
        spec += cost.eflops * emitted / per_round
        t += per_round
    return dense / spec
