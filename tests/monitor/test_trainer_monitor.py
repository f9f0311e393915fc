"""The trainer's monitor wiring on a tiny model: the noise-floor share is rolled out densely and
kept out of the controller's input, and the measured speedup is logged beside the prediction."""

import pytest
import torch

from sparrow.cli.config_loader import load_config
from sparrow.train.trainer import GRPOTrainer

# 4-token pages and a 3-page budget: the ~30-token prompts decode sparsely from the first step.
OVERRIDES = [
    "preset=tiny",
    "rollout.engine.page_size=4",
    "schedule.mode=fixed",
    "schedule.budgets_pages=[3]",
    "rollout.max_new_tokens=12",
    "rl.eval.every=0",
    "monitor.exact=true",
    "monitor.exact_fraction=1.0",
    "monitor.noise_floor_fraction=0.25",
    "monitor.speedup_every=1",
]


@pytest.fixture(scope="module")
def step_metrics(tmp_path_factory):
    cfg = load_config([*OVERRIDES, f"run_dir={tmp_path_factory.mktemp('run')}"])
    trainer = GRPOTrainer.from_config(cfg)
    generated = []
    generate = trainer.engine.generate

    def recording_generate(*args, **kwargs):
        outs = generate(*args, **kwargs)
        generated.append(outs)
        return outs

    trainer.engine.generate = recording_generate
    controller_input = []
    controller = trainer.steering.controller
    update = controller.update
    controller.update = lambda stats: controller_input.append(stats) or update(stats)
    metrics = trainer.train_step()
    return trainer, metrics, generated, controller_input


def test_noise_floor_prompts_roll_out_densely(step_metrics):
    trainer, metrics, generated, _ = step_metrics
    rollout = generated[0]  # the training rollout (then the timed dense probe)
    page = trainer.cfg.rollout.engine.page_size
    floor = [o for o in rollout if o.prompt_index == 3]  # 1 of the 4 prompts
    sparse = [o for o in rollout if o.prompt_index < 3]
    for o in floor:  # every token read all its pages
        ctx = len(o.prompt_ids) + torch.arange(len(o.token_ids))
        assert o.budget_pages.tolist() == (-(-ctx // page)).tolist()
    assert all(o.budget_pages[1:].max() == 3 for o in sparse if len(o.token_ids) > 1)


def test_noise_floor_is_logged_apart_from_what_the_controller_reads(step_metrics):
    _, metrics, _, controller_input = step_metrics
    floor_tokens = sum(v for k, v in metrics.items() if k.startswith("noise_floor/count/"))
    sparse_tokens = sum(v for k, v in metrics.items() if k.startswith("accept/count/"))
    assert floor_tokens > 0 and sparse_tokens > 0
    [stats] = controller_input  # the controller read the sparse rows' tokens, no floor token
    assert sum(s.count for s in stats) == sparse_tokens
    # Dense engine vs dense actor in fp32: the floor is 1; the 3-page budget is not.
    assert metrics["noise_floor/p5_min"] > 0.9999
    assert metrics["accept/p5_min"] < metrics["noise_floor/p5_min"]
    assert metrics["kv_read_ratio"] < 1.0


def test_measured_speedup_is_logged_beside_the_prediction(step_metrics):
    _, metrics, generated, _ = step_metrics
    assert len(generated) == 2  # rollout + the timed dense probe of the same prompts
    assert all(o.budget_pages.max() > 3 for o in generated[1] if len(o.token_ids) > 8)
    assert metrics["speedup/measured"] == pytest.approx(
        metrics["speedup/sparse_decode_tok_s"] / metrics["speedup/dense_decode_tok_s"]
    )
    assert metrics["speedup/predicted"] > 1.0
