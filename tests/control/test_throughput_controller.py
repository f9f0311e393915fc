"""Throughput controller (control/throughput.py): k and per-bin budgets from a hand-made rate
E(a, k) / (k * budget + verify), so each choice is checked against values computed by hand."""

import pytest

from sparrow.control.acceptance import BinStats
from sparrow.control.controller import ControllerConfig, OnlineController, resolve_objective
from sparrow.control.cost_model import expected_tokens_per_round
from sparrow.control.schedule import BudgetSchedule
from sparrow.control.throughput import BudgetBinStats, ThroughputController

GRID = (4, 8, 16, 32)
CFG = ControllerConfig(min_tokens=10)


def rate(verify: float):
    """Tokens per unit of cost: a draft step costs its budget, the verify pass `verify`."""
    return lambda bin_index, budget, a, k: expected_tokens_per_round(a, k) / (k * budget + verify)


def seen(bin_index: int, budget: int, mean: float, count: int = 100) -> BudgetBinStats:
    return BudgetBinStats(budget, BinStats(bin_index, 0, 0, count, mean, mean, mean, mean))


def controller(budgets, verify=100.0, k=4, move=True):
    schedule = BudgetSchedule(1000, tuple(budgets), GRID)
    return ThroughputController(schedule, CFG, rate(verify), k, move_budgets=move)


def test_k_maximises_the_expected_tokens_per_cost():
    # a = 0.8 at budget 8, verify 100: E(0.8, k) / (8k + 100) for k = 1..8 is .01667 .02103
    # .02381 .02547 .02635 .02670 .02667 .02640: k = 6. With a cheap verify (10) drafting more
    # than one token does not pay: 1.8 / 18 = .1 > 2.44 / 26 = .0938.
    c = controller([8])
    c.measured[(0, 4)] = c.measured[(0, 16)] = 0.0  # neighbours known and useless
    c.update([seen(0, 8, 0.8)])
    assert c.draft_tokens == 6
    cheap = controller([8], verify=10.0)
    cheap.measured[(0, 4)] = cheap.measured[(0, 16)] = 0.0
    cheap.update([seen(0, 8, 0.8)])
    assert cheap.draft_tokens == 1


def test_a_bin_explores_its_unmeasured_neighbours_then_settles_on_the_best():
    c = controller([8])
    c.update([seen(0, 8, 0.8)])
    assert c.schedule.budgets_pages == (4,) and c.last_actions == ("explore",)  # lower first
    # At 4, a = 0.5: best at k = 6 is still 8 (E(.5, 6) / 124 = .0160 < .0267), so the upper
    # neighbour 16 is measured next.
    c.update([seen(0, 4, 0.5)])
    assert c.schedule.budgets_pages == (16,) and c.last_actions == ("explore",)
    # At 16, a = 0.82: E(.82, 6) / 196 = .0211 < .0267: back to 8, both neighbours known.
    c.update([seen(0, 16, 0.82)])
    assert c.schedule.budgets_pages == (8,) and c.last_actions == ("move",)
    c.update([seen(0, 8, 0.8)])
    assert c.schedule.budgets_pages == (8,) and c.last_actions == ("hold",)
    # A cheaper budget that keeps its acceptance wins once measured again.
    c.update([seen(0, 8, 0.8), seen(0, 4, 0.79)])
    assert c.schedule.budgets_pages == (4,)


def test_one_k_for_the_step_weighs_the_bins_by_their_tokens():
    """Bin 0 alone prefers a large k (a = 0.95), bin 1 a small one (a = 0.3): the step's k
    minimises the summed cost of both bins' tokens, so the bin with most tokens leads."""

    def chosen(n0, n1):
        c = controller([8, 8])
        for i in (0, 1):
            c.measured[(i, 4)] = c.measured[(i, 16)] = 0.0
        c.update([seen(0, 8, 0.95, n0), seen(1, 8, 0.3, n1)])
        return c.draft_tokens

    def cost(k, n0, n1):
        return sum(n / rate(100.0)(0, 8, a, k) for n, a in ((n0, 0.95), (n1, 0.3)))

    for n0, n1 in ((1000, 10), (10, 1000), (300, 300)):
        assert chosen(n0, n1) == min(range(1, 9), key=lambda k: cost(k, n0, n1))
    assert chosen(1000, 10) > chosen(10, 1000)


def test_budgets_stay_monotone_and_sparse_bins_are_left_alone():
    c = controller([8, 8, 8])
    for i in (0, 1):
        c.measured[(i, 4)] = c.measured[(i, 16)] = c.measured[(i, 32)] = 0.0
    c.measured[(0, 16)] = 0.99  # bin 0 is best at 16
    c.update([seen(0, 8, 0.5), seen(1, 8, 0.9), seen(2, 8, 0.9, count=5)])
    # Bin 2 (5 drafts) is not acted on, but no bin's budget goes below the bin before it.
    assert c.schedule.budgets_pages == (16, 16, 16)
    assert c.last_actions == ("move", "hold+lifted", "empty+lifted")


def test_an_acceptance_rounded_past_one_is_one():
    """Dense drafts (budget past every page) measure 1 + an fp32 ulp: the controller reads 1
    (the tiny preset's run stopped on `acceptance must be in [0, 1]` before)."""
    c = controller([8])
    c.update([seen(0, 8, 1.0000000149011612)])
    assert c.measured[(0, 8)] == 1.0


def test_fixed_mode_moves_k_alone():
    c = controller([8], move=False)
    c.update([seen(0, 8, 0.8)])
    assert c.schedule.budgets_pages == (8,) and c.draft_tokens == 6


def test_no_drafts_no_move_and_the_state_round_trips():
    c = controller([8])
    c.update([])
    assert c.schedule.budgets_pages == (8,) and c.draft_tokens == 4
    c.update([seen(0, 8, 0.8)])
    again = controller([8])
    again.load_state_dict(c.state_dict())
    assert (again.schedule, again.draft_tokens, again.measured) == (
        c.schedule,
        c.draft_tokens,
        c.measured,
    )
    # A tail controller's state: its budgets; and the tail controller takes this one's.
    tail = OnlineController(BudgetSchedule(1000, (16,), GRID), CFG)
    again.load_state_dict(tail.state_dict())
    assert again.schedule.budgets_pages == (16,)
    tail.load_state_dict(c.state_dict())
    assert tail.schedule.budgets_pages == c.schedule.budgets_pages


def test_objective_resolution():
    assert resolve_objective("auto", True) == "throughput"
    assert resolve_objective("auto", False) == "tail"
    assert resolve_objective("tail", True) == "tail"
    with pytest.raises(ValueError, match="needs rollout.speculative.enabled"):
        resolve_objective("throughput", False)
    with pytest.raises(ValueError, match="controller.objective"):
        ControllerConfig(objective="speed")
