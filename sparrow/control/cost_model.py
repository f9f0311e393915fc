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
