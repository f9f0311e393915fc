"""The step's small pieces with explicit inputs: the phase timer and the rank reductions (one
rank)."""

import time

import torch

from sparrow.distributed import Ranks
from sparrow.train.phase_timer import PhaseTimer


def test_phase_timer_adds_a_phase_entered_twice():
    timer = PhaseTimer()
    for _ in range(2):
        with timer("update"):
            time.sleep(0.01)
    metrics = timer.metrics()
    assert metrics["time/update_s"] >= 0.02
    assert metrics["time/step_s"] >= metrics["time/update_s"]


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
    assert ranks.bounds(4) == (4.0, 4.0) and ranks.all_equal(object())
    param = torch.nn.Parameter(torch.ones(2))
    ranks.sum_gradients_([param])  # nothing to sum: no gradient is made up
    assert param.grad is None
