"""Decode cost model: a hand-computed case, dense limit, monotonicity in the budget."""

from itertools import pairwise
from types import SimpleNamespace

import pytest

from sparrow.control.cost_model import CostConfig, ModelShape, decode_cost, predicted_speedup
from sparrow.control.schedule import BudgetSchedule

TINY = ModelShape(
    num_layers=2,
    hidden=4,
    num_heads=2,
    num_kv_heads=1,
    head_dim=2,
    intermediate=8,
    vocab=10,
    dtype_bytes=2,
)
CFG = CostConfig(flops_per_byte=10.0, num_dense_layers=1, summary_vectors_per_page=1)
# Qwen3-1.7B's shape.
QWEN3_1P7B = ModelShape(28, 2048, 16, 8, 128, 6144, 151936, 2)


def _sched(pages):
    return BudgetSchedule(bin_tokens=2000, budgets_pages=(pages,), page_size=16)


def test_hand_computed_case():
    # Params per layer: q 16 + k 8 + v 8 + o 16 + MLP 96 = 144; x2 layers + LM head 40 = 328.
    assert TINY.num_params == 328
    # One step (prompt 32, 1 token), batch 1. Linear: 656 FLOPs, 656 bytes.
    # Dense layer over 32 tokens: 4*2*2*32 = 512 FLOPs, 2*1*2*2*32 = 256 bytes.
    dense = decode_cost(TINY, 32, 1, 1, None, CFG)
    assert (dense.compute_flops, dense.memory_bytes) == (656 + 2 * 512, 656 + 2 * 256)
    assert dense.eflops == 1680 + 10 * 1168
    # Sparse layer 1 at 1 page: 16 tokens (256 FLOPs, 128 bytes) + 2 page summaries
    # (2 pages * 1 kv head * 2 dims * 2 bytes = 8 bytes; 2 pages * 2*2*2 = 16 FLOPs).
    sparse = decode_cost(TINY, 32, 1, 1, _sched(1), CFG)
    assert (sparse.compute_flops, sparse.memory_bytes) == (
        656 + 512 + 256 + 16,
        656 + 256 + 128 + 8,
    )
    assert predicted_speedup(TINY, 32, 1, 1, _sched(1), CFG) == pytest.approx(13360 / 11920)


def test_batch_amortises_parameter_reads():
    one = decode_cost(TINY, 32, 1, 1, None, CFG)
    four = decode_cost(TINY, 32, 1, 4, None, CFG)
    assert four.memory_bytes == 656 + 4 * 512 and four.compute_flops == 4 * one.compute_flops


def test_budget_covering_all_pages_costs_only_the_summaries():
    cfg = CostConfig()
    ratio = predicted_speedup(QWEN3_1P7B, 4096, 2048, 64, _sched(1024), cfg)  # 6K < 16K tokens
    assert 0.97 < ratio < 1.0


def test_speedup_falls_as_budget_grows_and_rises_with_context():
    cfg = CostConfig()
    speedups = [
        predicted_speedup(QWEN3_1P7B, 8192, 4096, 64, _sched(p), cfg) for p in (32, 64, 128, 256)
    ]
    assert all(a > b for a, b in pairwise(speedups)), speedups
    assert speedups[0] > 2.0
    short = predicted_speedup(QWEN3_1P7B, 1024, 1024, 64, _sched(32), cfg)
    assert short < speedups[0]


def test_shape_from_hf_config():
    hf = SimpleNamespace(
        num_hidden_layers=30,
        hidden_size=576,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        vocab_size=49152,
    )
    s = ModelShape.from_hf_config(hf, dtype_bytes=4)
    assert (s.head_dim, s.num_kv_heads, s.dtype_bytes) == (64, 3, 4)
