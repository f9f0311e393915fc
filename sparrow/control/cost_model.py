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

from sparrow.control.schedule import BudgetSchedule


@dataclass
class ModelShape:
    num_layers: int  # transformer blocks
    hidden: int  # model width
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (GQA)
    head_dim: int  # per-head width
    intermediate: int  # gated MLP width (three hidden x intermediate matrices)
    vocab: int  # LM-head rows
    dtype_bytes: int = 2  # bytes per weight / KV element (bf16)

    @classmethod
    def from_hf_config(cls, config, dtype_bytes: int = 2) -> "ModelShape":
        """From a transformers Llama/Qwen3-style config (attributes read, nothing imported)."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // (
            config.num_attention_heads
        )
        return cls(
            config.num_hidden_layers,
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim,
            config.intermediate_size,
            config.vocab_size,
            dtype_bytes,
        )

    @property
    def num_params(self) -> int:
        """Weights read per decode step (norms and the embedding gather are negligible)."""
        attn = self.hidden * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden * self.intermediate
        return self.num_layers * (attn + mlp) + self.vocab * self.hidden


@dataclass
class CostConfig:
    flops_per_byte: float = 206.0  # I: hardware FLOPs per byte of memory traffic (H200 ~206)
    num_dense_layers: int = 2  # leading layers that stay dense (Sparrow: layers 0 and 1)
    summary_vectors_per_page: int = 1  # key vectors per page summary: 1 mean key, 2 Quest min/max


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
    attn_flops_per_token = 4 * shape.num_heads * shape.head_dim  # QK and PV, per layer
    kv_bytes_per_token = 2 * shape.num_kv_heads * shape.head_dim * shape.dtype_bytes  # per layer
    summary_bytes = cfg.summary_vectors_per_page * shape.num_kv_heads * shape.head_dim
    summary_bytes *= shape.dtype_bytes  # per page and layer
    summary_flops = 2 * cfg.summary_vectors_per_page * shape.num_heads * shape.head_dim

    read_tokens = 0  # per sequence, summed over steps and layers
    summary_pages = 0  # per sequence, summed over steps and sparse layers
    for t in range(prompt_tokens, prompt_tokens + output_tokens):
        read_tokens += num_dense * t
        if num_sparse:
            pages = -(-t // schedule.page_size)
            read_tokens += num_sparse * min(schedule.budget_tokens(t), t)
            summary_pages += num_sparse * pages
    compute = batch_size * (
        output_tokens * 2 * shape.num_params
        + read_tokens * attn_flops_per_token
        + summary_pages * summary_flops
    )
    memory = output_tokens * shape.num_params * shape.dtype_bytes + batch_size * (
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
