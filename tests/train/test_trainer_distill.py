"""DistillSparse inside the GRPO loop (tiny model): the adapter trains after the dense update, the
engine samples from theta + phi, evaluation uses theta alone, and a checkpoint restores phi. Merged
phi (distill.gate=false) in the engine's weights; gated phi (the default) as unmerged factors."""

import pytest
import torch

from sparrow.cli.config_loader import load_config
from sparrow.train.trainer import GRPOTrainer

OVERRIDES = [
    "preset=tiny",
    "distill=default",
    "distill.lr_factor=100",  # a visible adapter after one step
    "distill.lambda_kl=1.0",  # the top-K KL term gets the actor's dense top-K
    "rollout.engine.page_size=4",
    "schedule.mode=fixed",
    "schedule.budgets_pages=[3]",
    "rl.eval.every=0",
    "rl.steps=1",
]
MERGED = [*OVERRIDES, "distill.gate=false"]


def _engine_weight(trainer, name: str) -> torch.Tensor:
    return trainer.engine.runner.model._parameter_views()[name].clone()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    trainer = GRPOTrainer.from_config(load_config([*MERGED, f"run_dir={run_dir}"]))
    metrics = trainer.train_step()
    trainer.step = 1
    trainer.save()
    return trainer, metrics, run_dir


def test_adapter_trains_and_engine_samples_from_theta_plus_phi(trained):
    trainer, metrics, _ = trained
    assert metrics["distill/grad_norm"] > 0 and metrics["time/distill_s"] > 0
    assert metrics["distill/kl_topk"] > 0
    name = "model.layers.0.self_attn.q_proj.weight"
    theta = trainer.actor.gathered_state_dict()[name]
    merged = trainer.distill.merged_state_dict()[name]
    assert not torch.allclose(theta, merged)  # phi moved
    assert torch.equal(_engine_weight(trainer, name), merged)


def test_evaluation_uses_theta_and_restores_the_rollout_weights(trained):
    trainer, _, _ = trained
    name = "model.layers.1.mlp.down_proj.weight"
    seen = []
    engine_generate = trainer.engine.generate

    def spy(*args, **kwargs):
        seen.append(_engine_weight(trainer, name))
        return engine_generate(*args, **kwargs)

    trainer.engine.generate = spy
    try:
        trainer._evaluate()
    finally:
        trainer.engine.generate = engine_generate
    assert torch.equal(seen[0], trainer.actor.gathered_state_dict()[name])
    assert torch.equal(_engine_weight(trainer, name), trainer.distill.merged_state_dict()[name])


def test_resume_restores_the_adapter(trained):
    trainer, _, run_dir = trained
    resumed = GRPOTrainer.from_config(load_config([*MERGED, f"run_dir={run_dir}", "rl.steps=2"]))
    resumed.resume()
    assert resumed.step == 1 and resumed.distill.num_steps == 1
    for key, value in trainer.distill.merged_state_dict().items():
        assert torch.equal(resumed.distill.merged_state_dict()[key], value), key
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(_engine_weight(resumed, name), trainer.distill.merged_state_dict()[name])


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("gated")
    overrides = [*OVERRIDES, "monitor.noise_floor_fraction=0.25", f"run_dir={run_dir}"]
    trainer = GRPOTrainer.from_config(load_config(overrides))
    assert trainer.distill.cfg.gate
    return trainer, trainer.train_step()


def _engine_factors_equal(trainer) -> bool:
    """The engine's unmerged o_proj delta of every layer is the adapter's (A, scaled B)."""
    factors = trainer.distill.lora_factors()
    lora = trainer.engine.runner.model.lora
    return lora is not None and all(
        torch.equal(layer.o.a, factors[f"model.layers.{i}.self_attn.o_proj"][0])
        and torch.equal(layer.o.b, factors[f"model.layers.{i}.self_attn.o_proj"][1])
        for i, layer in enumerate(lora)
    )


def test_gated_engine_holds_theta_and_phi_as_factors(gated):
    trainer, metrics = gated
    assert metrics["distill/grad_norm"] > 0
    theta = trainer.actor.gathered_state_dict()
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        assert torch.equal(_engine_weight(trainer, name), theta[name])
        assert not torch.allclose(trainer.distill.merged_state_dict()[name], theta[name])
    assert _engine_factors_equal(trainer)
    # The engine's dense decode is theta's, so the noise floor is measured with the adapter on.
    assert "noise_floor/mean" in metrics


def test_gated_evaluation_keeps_the_adapter_set(gated):
    trainer, _ = gated
    name = "model.layers.1.mlp.down_proj.weight"
    seen = []
    engine_generate = trainer.engine.generate

    def spy(*args, **kwargs):
        seen.append((trainer.engine.schedule, _engine_weight(trainer, name)))
        return engine_generate(*args, **kwargs)

    trainer.engine.generate = spy
    try:
        trainer._evaluate()
    finally:
        trainer.engine.generate = engine_generate
    schedule, weight = seen[0]
    assert schedule is None  # dense decode: the gate is shut, the engine is theta
    assert torch.equal(weight, trainer.actor.gathered_state_dict()[name])
    assert trainer.engine.schedule is not None and _engine_factors_equal(trainer)
