"""Distill-only training (`rl.update_policy=false`): rollouts, dense log-probs, acceptance, the
controller and the DistillSparse update run, theta does not move (no optimizer step, the same
weights in the actor and the engine), the adapter does and is restored on resume. The real
trainer on the tiny preset, in process."""

import json

import pytest
import torch

from sparrow.cli.config_loader import load_config
from sparrow.control.kv_read import sparse_tokens
from sparrow.train.trainer import GRPOTrainer

OVERRIDES = [
    "preset=tiny",
    "rl.update_policy=false",
    "distill.lr_factor=100",  # a visible adapter after one step
    "distill.lambda_kl=1.0",
    "rollout.engine.page_size=4",  # 4-token pages: the tiny prompts' contexts span many of them
    "schedule.budgets_pages=[3]",
    "rl.eval.every=0",
    "rl.steps=2",
    "rl.save_every=1",
]


def _theta(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.actor.model.state_dict().items()}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("distill_only")
    trainer = GRPOTrainer.from_config(
        load_config([*OVERRIDES, "distill=default", f"run_dir={run_dir}"])
    )
    before = _theta(trainer)
    views = trainer.engine.runner.model._parameter_views()
    engine_before = {k: v.clone() for k, v in views.items()}
    pushed = []
    real_update = trainer.engine.update_weights
    trainer.engine.update_weights = lambda sd: pushed.append(sd) or real_update(sd)
    batches = []
    real_rollout = trainer.draw.rollout
    trainer.draw.rollout = lambda prompts: batches.append(real_rollout(prompts)) or batches[-1]
    trainer.fit()
    return trainer, before, engine_before, pushed, batches, run_dir


def test_theta_stays_and_no_optimizer_step_is_taken(run):
    trainer, before, engine_before, pushed, _, _ = run
    after = _theta(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not trainer.actor.engine.optimizer.state  # AdamW never stepped: no moments exist
    assert not pushed  # theta was never re-sent to the engine
    engine = trainer.engine.runner.model._parameter_views()
    assert all(torch.equal(engine_before[k], engine[k]) for k in engine_before)


def test_adapter_trains_and_the_engine_holds_it(run):
    trainer = run[0]
    assert trainer.distill.num_steps == 2
    factors = trainer.distill.lora_factors()
    assert any(float(b.abs().sum()) > 0 for _, b in factors.values())  # B starts at 0 in LoRA
    lora = trainer.engine.runner.model.lora
    name = "model.layers.0.self_attn.o_proj"
    assert torch.equal(lora[0].o.b, factors[name][1])


def test_metrics_count_the_sparse_tokens(run):
    _, _, _, _, batches, run_dir = run
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["update/policy_frozen"] for r in rows] == [1.0, 1.0]
    assert all(r["distill/kl_topk"] > 0 for r in rows)
    for row, rollout in zip(rows, batches, strict=True):
        batch = rollout.batch
        expected = sparse_tokens(batch.budget_pages, batch.completion_mask, 4)
        assert row["rollout/sparse_tokens"] == expected > 0


def test_resume_restores_the_adapter_and_keeps_theta(run):
    trainer, before, _, _, _, run_dir = run
    resumed = GRPOTrainer.from_config(
        load_config([*OVERRIDES, "distill=default", f"run_dir={run_dir}", "rl.steps=3"])
    )
    resumed.resume()
    assert resumed.step == 2 and resumed.distill.num_steps == 2
    for key, value in trainer.distill.lora_factors().items():
        assert torch.equal(resumed.distill.lora_factors()[key][1], value[1]), key
    after = _theta(resumed)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_without_the_adapter_nothing_is_trained(tmp_path):
    trainer = GRPOTrainer.from_config(
        load_config([*OVERRIDES, "rl.steps=1", f"run_dir={tmp_path}"])
    )
    before = _theta(trainer)
    metrics = trainer.train_step()
    assert trainer.distill is None and "distill/kl_topk" not in metrics
    assert metrics["update/policy_frozen"] == 1.0 and metrics["rollout/sparse_tokens"] > 0
    after = _theta(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)
