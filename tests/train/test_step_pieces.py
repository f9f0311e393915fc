"""The step's small pieces with explicit inputs: the rollout plan, the KV-read ratio, the phase
timer and the rank reductions (one rank)."""

import time

import torch

from sparrow.control.acceptance import MonitorConfig
from sparrow.control.kv_read import kv_pages, kv_read_ratio
from sparrow.train.distributed import Ranks
from sparrow.train.phase_timer import PhaseTimer
from sparrow.train.rollout_plan import plan_rollout


def test_plan_rolls_the_last_prompts_densely_and_keeps_logits_of_every_kth_row():
    cfg = MonitorConfig(exact=True, exact_fraction=0.5, noise_floor_fraction=0.25)
    sparse = object()  # any schedule
    plan = plan_rollout(
        cfg, num_prompts=4, group_size=2, sparse=sparse, engine_is_dense_policy=True
    )
    assert plan.num_floor == 1
    assert plan.floor_rows.tolist() == [False] * 6 + [True] * 2
    assert plan.schedules == [sparse] * 6 + [None] * 2
    assert plan.logit_rows == [True, False, True, False, True, False, True, True]


def test_plan_without_a_dense_policy_engine_or_sparsity_has_no_floor():
    cfg = MonitorConfig(exact=False, noise_floor_fraction=0.5)
    for sparse, dense_policy in ((object(), False), (None, True)):
        plan = plan_rollout(cfg, 4, 2, sparse, engine_is_dense_policy=dense_policy)
        assert plan.num_floor == 0 and plan.schedules is None and plan.logit_rows is None
        assert not plan.floor_rows.any()


def test_kv_pages_counts_dense_pages_by_position():
    # One row: prompt at 0-4, completion at positions 5-8 (4 tokens), 4-token pages.
    mask = torch.tensor([[False] * 5 + [True] * 4])
    budget = torch.full(mask.shape, 2)
    read, dense = kv_pages(budget, mask, page_size=4)
    assert read == 8.0
    assert dense == 2 + 2 + 2 + 2  # ceil(5/4), ceil(6/4), ceil(7/4), ceil(8/4)
    assert kv_read_ratio(read, dense) == 1.0 and kv_read_ratio(0.0, 0.0) == 0.0


def test_phase_timer_adds_a_phase_entered_twice():
    timer = PhaseTimer()
    for _ in range(2):
        with timer("monitor"):
            time.sleep(0.01)
    metrics = timer.metrics()
    assert metrics["time/monitor_s"] >= 0.02
    assert metrics["time/step_s"] >= metrics["time/monitor_s"]


def test_phase_timer_phases_tile_the_step():
    timer = PhaseTimer()
    with timer("rollout"):
        time.sleep(0.01)
    time.sleep(0.02)  # between phases: charged to the next one, not lost
    with timer("update"):
        pass
    metrics = timer.metrics()
    assert metrics["time/update_s"] >= 0.02
    assert metrics["time/step_s"] == metrics["time/rollout_s"] + metrics["time/update_s"]


def test_throughput_is_all_ranks_tokens_over_phase_seconds():
    from sparrow.train.step_report import throughput_metrics

    times = {"time/rollout_s": 2.0, "time/step_s": 8.0}
    assert throughput_metrics(100.0, 4, times) == {
        "throughput/rollout_tok_s": 200.0,
        "throughput/step_tok_s": 50.0,
    }


def test_one_rank_reductions_are_the_identity():
    ranks = Ranks(0, 1)
    assert ranks.sum(torch.tensor(3)) == 3.0 and ranks.mean(6.0, 4) == 1.5
    assert ranks.extreme([1.0, -2.0], "min") == -2.0 and ranks.extreme([1.0, 5.0], "max") == 5.0
    values, positions = torch.rand(5), torch.arange(5)
    assert ranks.gather_tokens(values, positions) == (values, positions)
