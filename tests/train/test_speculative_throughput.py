"""The loop's throughput objective with speculative rollouts (controller.objective=throughput,
the default there): the drafts' acceptance reaches the step's metrics and the step line, the
throughput controller moves the budgets and k from it, and the engine drafts with its k."""

from test_loop_fake_actor import _trainer

from sparrow.control.throughput import ThroughputController
from sparrow.train.step_report import format_plan, format_step_line

SPECULATIVE = ("rollout.speculative.enabled=true", "rollout.speculative.draft_tokens=3")
ONLINE = (
    "schedule.mode=online",
    "schedule.budgets_pages=[6]",
    "schedule.grid_pages=[3,6,12]",
    "controller.min_tokens=1",
)


def test_the_throughput_controller_steers_on_the_drafts_acceptance(tmp_path):
    trainer = _trainer(tmp_path, *SPECULATIVE, *ONLINE)
    controller = trainer.steering.controller
    assert isinstance(controller, ThroughputController)
    assert "controller.objective=throughput" in format_plan(trainer.cfg, "data", 1)
    metrics = trainer.train_step()
    bins = [k for k in metrics if k.startswith("spec/accept/bin") and k.endswith("/mean")]
    assert bins and all(0.0 < metrics[k] <= 1.0 + 1e-6 for k in bins)
    assert metrics["spec/draft_tokens"] == 3  # the batch's k
    assert metrics["spec/tokens_per_verify"] >= 1.0
    assert metrics["spec/drafted"] > 0 and metrics["spec/draft_s"] > 0
    assert metrics["speedup/predicted"] > 0 and "spec/tokens_per_verify/predicted" in metrics
    assert "spec a " in format_step_line(0, 2, metrics)
    # Every observed bin was measured at 6 pages; the lower neighbour (3) is explored next.
    assert controller.measured and {b for (_, b) in controller.measured} == {6}
    assert 3 in controller.schedule.budgets_pages
    assert trainer.engine.speculative.draft_tokens == controller.draft_tokens
    trainer.train_step()
    assert {b for (_, b) in controller.measured} >= {3, 6}
