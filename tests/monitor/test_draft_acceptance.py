"""The speculative acceptance of a step (monitor/draft_acceptance.py) and the steering that
reads it (train/schedule_steering.py): per-bin mean and p5 of the tested drafts, the tokens per
verify pass, the per-(bin, budget) stats the throughput controller gets, the engine's k."""

from dataclasses import replace

import pytest
import torch

from sparrow.control.schedule import ScheduleConfig
from sparrow.control.throughput import ThroughputController
from sparrow.distributed import Ranks
from sparrow.models.shape import ModelShape
from sparrow.monitor.draft_acceptance import draft_acceptance
from sparrow.rollout.outputs import DraftAcceptance, GenerateStats
from sparrow.rollout.speculative import SpeculativeConfig
from sparrow.train.config import SparrowConfig
from sparrow.train.schedule_steering import ScheduleSteering

QWEN3_1P7B = ModelShape(28, 2048, 6144, 16, 8, 128, 151936)


def step_stats() -> GenerateStats:
    # Bin 0 (positions < 100) at budget 4: 0.2, 0.4, 0.6, 0.8; bin 1 at 4: 0.9; at 8: 1.0.
    drafts = DraftAcceptance(
        [10, 11, 50, 90, 150, 160],
        [4, 4, 4, 4, 4, 8],
        [0.2, 0.4, 0.6, 0.8, 0.9, 1.0],
    )
    return GenerateStats(
        spec_rounds=3, spec_verified=4, spec_drafted=8, spec_accepted=5,
        spec_draft_s=1.5, spec_verify_s=0.5, spec_accept=drafts,
    )  # fmt: skip


def test_metrics_and_per_budget_stats_by_hand():
    metrics, by_budget = draft_acceptance(step_stats(), 100, Ranks(0, 1))
    assert metrics["spec/accept/bin0/mean"] == pytest.approx(0.5)
    # p5 of 0.2, 0.4, 0.6, 0.8 at index 0.05 * 3 = 0.15: 0.2 + 0.15 * 0.2 = 0.23.
    assert metrics["spec/accept/bin0/p5"] == pytest.approx(0.23)
    assert metrics["spec/accept/bin1/mean"] == pytest.approx(0.95)
    assert metrics["spec/accept/bin0/count"] == 4 and metrics["spec/accept/bin1/count"] == 2
    assert metrics["spec/accept/mean"] == pytest.approx(3.9 / 6)
    assert metrics["spec/tokens_per_verify"] == pytest.approx((5 + 4) / 4)
    assert (metrics["spec/drafted"], metrics["spec/accepted"]) == (8, 5)
    assert (metrics["spec/draft_s"], metrics["spec/verify_s"]) == (1.5, 0.5)
    got = {(s.budget_pages, s.stats.bin_index): (s.stats.count, s.stats.mean) for s in by_budget}
    assert got == {(4, 0): (4, pytest.approx(0.5)), (4, 1): (1, 0.9), (8, 1): (1, 1.0)}


class FakeEngine:
    def __init__(self, k: int):
        self.schedule, self.speculative = None, SpeculativeConfig(enabled=True, draft_tokens=k)

    def set_schedule(self, schedule):
        self.schedule = schedule

    def set_draft_tokens(self, k: int):
        self.speculative = replace(self.speculative, draft_tokens=k)


class FakeBatch:
    prompt_lens = torch.tensor([40, 40])
    completion_mask = torch.ones(2, 100, dtype=torch.bool)

    def __len__(self):
        return 2


def steering(objective: str, mode: str = "online") -> ScheduleSteering:
    cfg = SparrowConfig()
    cfg.rollout.speculative = SpeculativeConfig(enabled=True, draft_tokens=4)
    cfg.schedule = ScheduleConfig(mode, 100, [4], [2, 4, 8])
    cfg.controller = replace(cfg.controller, objective=objective, min_tokens=1)
    return ScheduleSteering(cfg, FakeEngine(4), QWEN3_1P7B, Ranks(0, 1))


def test_throughput_steering_moves_the_schedule_and_k_and_predicts():
    s = steering("auto")
    assert isinstance(s.controller, ThroughputController)
    metrics = s.update(FakeBatch(), [], step_stats())
    assert metrics["spec/draft_tokens"] == 4  # the k the batch was drafted with
    # Bin 0 (4 drafts at a = 0.5) and bin 1 (2 at ~0.95): E(0.5, 4) = 1.9375, E(0.95, 4) = 4.524.
    tokens = (4 * 1.9375 + 2 * expected(0.95, 4)) / 6
    assert metrics["spec/tokens_per_verify/predicted"] == pytest.approx(tokens)
    assert metrics["speedup/predicted"] > 0
    c = s.controller
    assert c.measured[(0, 4)] == pytest.approx(0.5) and (1, 8) in c.measured
    assert s.engine.speculative.draft_tokens == c.draft_tokens
    assert s.engine.schedule(50) == c.schedule.budget_pages(50) == 2  # bin 0 explores down


def expected(a, k):
    return (1 - a ** (k + 1)) / (1 - a)


def test_tail_objective_with_speculative_rollouts_holds_the_budgets():
    s = steering("tail")
    metrics = s.update(FakeBatch(), [], step_stats())
    assert metrics["spec/accept/bin0/mean"] == pytest.approx(0.5)  # logged all the same
    assert s.controller.schedule.budgets_pages == (4,)
    assert s.engine.speculative.draft_tokens == 4
