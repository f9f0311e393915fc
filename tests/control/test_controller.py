"""Online budget controller: raise, hysteresis, monotonicity, empty bins, state round trip."""

import random
from itertools import pairwise

import pytest

from sparrow.control.acceptance import BinStats
from sparrow.control.controller import (
    ControllerConfig,
    FixedController,
    OnlineController,
    make_controller,
    step_down,
    step_up,
)
from sparrow.control.schedule import BudgetSchedule, ScheduleConfig

GRID = (4, 8, 16, 32, 64, 128)
W = 100  # bin width in tokens
CFG = ControllerConfig(tau=0.86, margin=0.03, patience=3, min_tokens=10)
SAFE, OK, BAD = 0.95, 0.87, 0.5  # over-safe, in the hold band, failing


def _stats(p5_by_bin, count=50):
    return [BinStats(b, b * W, (b + 1) * W, count, p5, p5, p5, p5) for b, p5 in p5_by_bin.items()]


def _ctl(budgets, cfg=CFG):
    return OnlineController(BudgetSchedule(W, tuple(budgets), GRID), cfg)


def test_grid_steps():
    assert step_up(8, GRID) == 16 and step_up(128, GRID) == 128 and step_up(10, GRID) == 16
    assert step_down(8, GRID) == 4 and step_down(4, GRID) == 4 and step_down(10, GRID) == 8


def test_raises_failing_bin_and_lifts_later_bins():
    c = _ctl([8, 16, 16, 32])
    s = c.update(_stats({0: OK, 1: BAD, 2: OK, 3: OK}))
    assert s.budgets_pages == (8, 32, 32, 32)  # bin 1 up one step; bin 2 lifted to stay monotone
    assert c.last_actions == ("hold", "raise", "hold+lifted", "hold")
    s = c.update(_stats({0: BAD}))
    assert s.budgets_pages == (16, 32, 32, 32)


def test_raise_at_top_of_grid_saturates():
    c = _ctl([128])
    assert c.update(_stats({0: BAD})).budgets_pages == (128,)
    assert c.last_actions == ("saturated",)


def test_lowers_only_after_patience_consecutive_over_safe_steps():
    c = _ctl([8, 32])
    for _ in range(2):
        assert c.update(_stats({0: OK, 1: SAFE})).budgets_pages == (8, 32)
    c.update(_stats({1: OK}))  # a step in the hold band restarts the count
    for _ in range(2):
        assert c.update(_stats({1: SAFE})).budgets_pages == (8, 32)
    assert c.update(_stats({1: SAFE})).budgets_pages == (8, 16)  # third in a row
    assert c.last_actions[1] == "lower"
    # The count restarted with the new budget: two more over-safe steps do not lower again.
    c.update(_stats({1: SAFE}))
    assert c.update(_stats({1: SAFE})).budgets_pages == (8, 16)
    assert c.update(_stats({1: SAFE})).budgets_pages == (8, 8)


def test_lowering_never_goes_below_the_previous_bin():
    c = _ctl([16, 16, 32])
    for _ in range(3):
        s = c.update(_stats({0: OK, 1: SAFE, 2: SAFE}))
    assert s.budgets_pages == (16, 16, 16)  # bin 1 blocked at bin 0's 16; bin 2 lowered to 16
    assert c.last_actions == ("hold", "lower+lifted", "lower")
    s = c.update(_stats({0: SAFE, 1: SAFE, 2: OK}))
    assert s.budgets_pages == (16, 16, 16)  # bin 0 has one over-safe step; bin 1 still blocked


def test_empty_and_sparse_bins_untouched_observed_bins_past_the_list_inherit():
    c = _ctl([8, 16])
    s = c.update(_stats({0: BAD}, count=5) + _stats({1: SAFE}, count=5))  # below min_tokens
    assert s.budgets_pages == (8, 16) and c.last_actions == ("empty", "empty")
    assert c.over_safe == [0, 0]
    c.update(_stats({1: SAFE}))
    # Bin 4 observed failing: the list grows, bins 2-3 (unobserved) inherit 16, bin 4 is raised.
    s = c.update(_stats({4: BAD}))
    assert s.budgets_pages == (8, 16, 16, 16, 32)
    assert c.over_safe == [0, 1, 0, 0, 0]  # new slots carry no evidence; bin 1 keeps its count
    assert s.budget_pages(10 * W) == 32  # beyond: the last value


def test_stays_monotone_under_random_feedback():
    rng = random.Random(0)
    c = _ctl([4])
    for _ in range(300):
        n = rng.randint(1, 8)
        p5 = {b: rng.choice([BAD, OK, SAFE, 0.9]) for b in range(n) if rng.random() < 0.8}
        counts = rng.choice([5, 50])
        s = c.update(_stats(p5, count=counts))
        b = s.budgets_pages
        assert all(x <= y for x, y in pairwise(b)), b
        assert set(b) <= set(GRID)


def test_state_round_trip_continues_identically():
    steps = [{0: SAFE, 1: BAD}, {0: SAFE, 1: SAFE}, {0: SAFE, 2: SAFE}, {0: SAFE, 1: SAFE}]
    a = _ctl([8, 16])
    for st in steps[:2]:
        a.update(_stats(st))
    b = _ctl([4])
    b.load_state_dict(a.state_dict())
    for st in steps[2:]:
        assert a.update(_stats(st)) == b.update(_stats(st))
    assert a.state_dict() == b.state_dict()
    with pytest.raises(ValueError, match="lengths"):
        b.load_state_dict({"budgets_pages": [4, 8], "over_safe": [0]})


def test_factory_modes():
    sc = ScheduleConfig("fixed", W, [8, 16], list(GRID))
    fixed = make_controller(sc, CFG)
    assert isinstance(fixed, FixedController)
    assert fixed.update(_stats({0: BAD})).budgets_pages == (8, 16)
    sc.mode = "online"
    online = make_controller(sc, CFG)
    assert isinstance(online, OnlineController) and online.schedule.budgets_pages == (8, 16)
    smallest = make_controller(sc, ControllerConfig(start_smallest=True))
    assert smallest.schedule.budgets_pages == (4,)
    sc.mode = "dense"
    assert make_controller(sc, CFG) is None


def test_resuming_with_another_table_or_tau_switches_by_hand():
    # Fixed: the configured table wins over the checkpoint's (a switch to a cheaper table).
    old = FixedController(BudgetSchedule(W, (16, 32), GRID))
    new = FixedController(BudgetSchedule(W, (8, 16), GRID))
    new.load_state_dict(old.state_dict())
    assert new.schedule.budgets_pages == (8, 16)
    # Online: budgets come back from the checkpoint, tau from the config: a lower tau lowers them.
    strict = OnlineController(BudgetSchedule(W, (16,), GRID), CFG)
    strict.update(_stats({0: OK}))
    lenient = OnlineController(
        BudgetSchedule(W, (4,), GRID),
        ControllerConfig(tau=0.80, margin=0.03, patience=1, min_tokens=10),
    )
    lenient.load_state_dict(strict.state_dict())
    assert lenient.schedule.budgets_pages == (16,)
    assert lenient.update(_stats({0: OK})).budgets_pages == (8,)  # 0.87 >= 0.80 + margin
