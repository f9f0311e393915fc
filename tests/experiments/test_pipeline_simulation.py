"""The GPU-layout cost simulation (docs/pipeline/): its table is what the module computes, its
formula gives hand-computed values on a toy model, and its inputs move the table."""

from dataclasses import replace

import pytest

from sparrow.control.schedule import BudgetSchedule
from sparrow.experiments import pipeline_simulation as sim
from sparrow.models.shape import ModelShape

# One layer of width 2: weights_read = 2*2*(2*1 + 2*1) + 3*2*2 + 2*2 = 32 matrix parameters.
TOY = ModelShape(
    num_layers=1,
    hidden_size=2,
    intermediate_size=2,
    num_q_heads=1,
    num_kv_heads=1,
    head_dim=2,
    vocab_size=2,
    tied_embeddings=True,
)
# 3 rows of 2 tokens (1 prompt token, 1 decoded at context t = 1), pages of 1 token: the
# colocated pool holds 4 // 2 = 2 rows, a rollout-only one 6 // 2 = 3; the one layer is sparse.
TOY_WORK = sim.Workload(
    prompts=1,
    group_size=3,
    prompt_tokens=1,
    context_tokens=2,
    page_size=1,
    colocated_pool_pages=4,
    rollout_pool_pages=6,
    dense_layers=0,
    forward_passes=5,
)
# I = 10 / 5 = 2 FLOPs per byte; decode at 5 eFLOP/s, training at 2.5 FLOP/s.
TOY_HW = sim.Hardware(
    gpus=2, peak_flops=10, hbm_bytes_s=5, link_bytes_s=4, decode_efficiency=0.5, train_mfu=0.25
)
SCHEDULE = BudgetSchedule(bin_tokens=10, budgets_pages=(1,))


def test_the_committed_table_is_what_the_module_computes():
    assert sim.main(["--check"]) == 0, "run: python -m sparrow.experiments.pipeline_simulation"


def test_step_formula():
    assert sim.step_seconds(10.0, 4.0, 1.0, colocated=True) == 15.0  # rollout, train, push
    assert sim.step_seconds(10.0, 4.0, 1.0, colocated=False) == 11.0  # max(rollout, train) + push
    assert sim.step_seconds(3.0, 4.0, 1.0, colocated=False) == 5.0


def test_toy_rollout_in_waves_by_hand():
    # One decode step of a wave of b rows at context 1:
    # dense: FLOPs 2*32*b + 4*1*2*1*b = 72 b; bytes 32*2 + b*(2*2*2*1) = 64 + 8 b;
    #   eFLOPs = 72 b + 2 (64 + 8 b) = 88 b + 128.
    # sparse: + one page summary per row (2*1*1*2 = 4 FLOPs, 1*2*2 = 4 bytes): 100 b + 128.
    # One GPU, colocated pool: 3 rows in waves of 2 and 1.
    dense, sparse = sim.rollout_seconds(TOY, SCHEDULE, TOY_WORK, TOY_HW, 1, 4)
    assert dense == pytest.approx((88 * 2 + 128 + 88 * 1 + 128) / 5)  # 104 s
    assert sparse == pytest.approx((100 * 2 + 128 + 100 * 1 + 128) / 5)  # 111.2 s


def test_toy_step_times_by_hand():
    colocated, split = sim.simulate(TOY, SCHEDULE, TOY_WORK, TOY_HW)
    # Training: 3 rows x 5 passes x (2*32*2 + 2*1*1*2*2^2) = 2160 FLOPs at 2.5 FLOP/s per GPU.
    assert colocated.train_s == pytest.approx(2160 / 2.5 / 2)  # 432 s on 2 GPUs
    assert split.train_s == pytest.approx(2160 / 2.5)  # 864 s on T = 1
    # Push: 2 bytes x 32 parameters, within HBM (5 B/s) colocated, over the link (4 B/s) split.
    assert colocated.push_s == pytest.approx(64 / 5) and split.push_s == pytest.approx(64 / 4)
    # Colocated: 2 rows per GPU, one wave of 2; split R = 1: 3 rows, one wave of 3.
    assert colocated.step_s(False) == pytest.approx((88 * 2 + 128) / 5 + 432 + 12.8)
    assert colocated.step_s(True) == pytest.approx((100 * 2 + 128) / 5 + 432 + 12.8)
    assert split.rollout_s == pytest.approx(((88 * 3 + 128) / 5, (100 * 3 + 128) / 5))
    assert split.step_s(True) == pytest.approx(864 + 16)  # training is the slower side
    assert (split.rollout_gpus, split.train_gpus) == (1, 1)


def test_a_changed_input_changes_the_table():
    committed = sim.README.read_text()
    assert sim.regenerate() == committed
    assert sim.regenerate(work=replace(sim.Workload(), prompts=16)) != committed
    assert sim.regenerate(planned=replace(sim.Hardware(), link_bytes_s=1e9)) != committed
    shape, schedule = TOY, SCHEDULE
    slower = replace(TOY_HW, train_mfu=TOY_HW.train_mfu / 2)
    for fast, slow in zip(
        sim.simulate(shape, schedule, TOY_WORK, TOY_HW),
        sim.simulate(shape, schedule, TOY_WORK, slower),
        strict=True,
    ):
        assert slow.train_s == pytest.approx(2 * fast.train_s)


def test_kv_read_fraction_by_hand():
    # Two layers, layer 0 dense; contexts 1, 2, 3 at a 1-token budget: the dense layer reads
    # 1 + 2 + 3 = 6, the sparse one 1 + 1 + 1 = 3, against 2 x 6 dense.
    shape = replace(TOY, num_layers=2)
    work = replace(TOY_WORK, prompt_tokens=1, context_tokens=4, dense_layers=1)
    assert sim.kv_read_fraction(shape, SCHEDULE, work) == pytest.approx(9 / 12)
