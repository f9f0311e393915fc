"""The cost model's speculative round (issue 59): expected tokens per round, the dense verify
pass, a round's cost and the speedups built on them, against hand-computed values."""

import pytest

from sparrow.control.cost_model import (
    CostConfig,
    decode_cost,
    expected_tokens_per_round,
    predicted_speculative_speedup,
    speculative_round_cost,
    speculative_speedup,
    speculative_tokens_per_eflop,
    verify_cost,
)
from sparrow.control.schedule import BudgetSchedule
from sparrow.models.shape import ModelShape

TINY = ModelShape(2, 4, 8, 2, 1, 2, 10)  # 328 weights (test_cost_model.py's hand count)
CFG = CostConfig(16, flops_per_byte=10.0, num_dense_layers=1, dtype_bytes=2)
QWEN3_1P7B = ModelShape(28, 2048, 6144, 16, 8, 128, 151936)
ONE_PAGE = BudgetSchedule(2000, (1,), (1,))


def test_expected_tokens_per_round_hand_values():
    assert expected_tokens_per_round(0.8, 4) == pytest.approx(3.3616)  # 1+.8+.64+.512+.4096
    assert expected_tokens_per_round(0.5, 1) == pytest.approx(1.5)
    assert expected_tokens_per_round(0.0, 6) == 1.0  # the residual draw alone
    assert expected_tokens_per_round(1.0, 4) == 5.0  # every draft and the bonus
    with pytest.raises(ValueError):
        expected_tokens_per_round(1.2, 4)


def test_verify_pass_hand_computed():
    # 3 queries at context 10: linear 3 * 2 * 328 = 1968 FLOPs; attention over 10 + 11 + 12
    # tokens in 2 layers at 4 * 2 heads * 2 dims = 16 FLOPs a token: 1056. Memory: the weights
    # once (656 bytes) and 12 keys + values a layer once (2 layers * 12 * 8 bytes = 192).
    v = verify_cost(TINY, 10, 3, 1, CFG)
    assert (v.compute_flops, v.memory_bytes) == (1968 + 1056, 656 + 192)
    assert v.eflops == 3024 + 10 * 848


def test_round_cost_and_speedup_hand_computed():
    # k = 1 at context 32: one sparse step (test_cost_model.py: 1440 FLOPs, 1048 bytes) and a
    # verify of 2 queries (1312 + 2 * 65 * 16 = 3392 FLOPs; 656 + 2 * 33 * 8 = 1184 bytes).
    r = speculative_round_cost(TINY, 32, 1, 1, ONE_PAGE, CFG)
    assert (r.compute_flops, r.memory_bytes) == (1440 + 3392, 1048 + 1184)
    assert r.eflops == 11920 + 15232
    # Dense decode of positions 32 and 33: 1680 + 1712 FLOPs, 1168 + 1184 bytes: 26912 eFLOPs.
    assert decode_cost(TINY, 32, 2, 1, None, CFG).eflops == 26912
    rate = speculative_tokens_per_eflop(TINY, 32, 1, 1, ONE_PAGE, 0.8, CFG)
    assert rate == pytest.approx(1.8 / 27152)
    assert speculative_speedup(TINY, 32, 1, 1, ONE_PAGE, 0.8, CFG) == pytest.approx(
        26912 / 2 * 1.8 / 27152
    )


def test_a_whole_round_of_output_predicts_the_rounds_speedup():
    """Output of exactly one round (a = 1, k + 1 tokens): the decode-level prediction is the
    round's; at a = 0 every round emits one token for k drafts and a verify: a slowdown."""
    sched = BudgetSchedule(2000, (128,), (128,))
    one = predicted_speculative_speedup(QWEN3_1P7B, 32768, 4, 16, sched, 3, lambda t: 1.0, CFG)
    assert one == pytest.approx(speculative_speedup(QWEN3_1P7B, 32768, 3, 16, sched, 1.0, CFG))
    none = predicted_speculative_speedup(QWEN3_1P7B, 32768, 64, 16, sched, 3, lambda t: 0.0, CFG)
    assert none < 1.0


def test_the_verify_pass_amortises_what_decode_reads_per_token():
    """At the headline shape (32K, batch 16, bf16) a verify of k + 1 tokens costs far less than
    k + 1 dense decode steps (one read of the weights and the K/V), so high acceptance with a
    cheap draft pays: the speedup grows with the acceptance and beats the sparse draft's own
    per-token cost ratio only when a is high."""
    cfg = CostConfig(16, num_dense_layers=2)
    sched = BudgetSchedule(2000, (128,), (128,))  # 2K-token budget
    verify = verify_cost(QWEN3_1P7B, 32768, 5, 16, cfg).eflops
    dense_steps = decode_cost(QWEN3_1P7B, 32768, 5, 16, None, cfg).eflops
    assert verify < dense_steps / 4
    speedups = [
        speculative_speedup(QWEN3_1P7B, 32768, 4, 16, sched, a, cfg) for a in (0.5, 0.8, 0.95)
    ]
    assert speedups == sorted(speedups) and speedups[0] > 1.0
