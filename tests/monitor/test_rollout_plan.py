"""The rollout plan: which rows of a step decode densely (the noise floor) and which keep their
logits for the exact acceptance."""

from sparrow.monitor.config import MonitorConfig
from sparrow.monitor.rollout_plan import plan_rollout


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
