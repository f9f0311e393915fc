"""LoRA RL (actor.lora) in the memory plan: the optimizer state and gradients are the adapter's
(peft's count, tests/train/memory/test_adapter_plan.py), the weights the base's plus the adapter's,
no KL reference copy (the base with the adapter off is the reference); sleep=weights is refused
(a LoRA sync never pushes the base again; the fit does not choose it either)."""

from dataclasses import replace

import pytest

from sparrow.cli.config_loader import load_config
from sparrow.models.random_init import random_model_config
from sparrow.models.shape import ModelShape
from sparrow.train.memory.adapter import lora_parameter_count
from sparrow.train.memory.plan import parameter_count, plan_memory

QWEN17 = ModelShape.from_hf_config(random_model_config("qwen3-1.7b"))


def _cfg(*overrides: str):
    return load_config(["preset=qwen3_1p7b_gpu", "rl.loss.kl_coef=0.01", *overrides])


def test_the_adapter_alone_holds_optimizer_state_and_gradients():
    full = plan_memory(_cfg(), QWEN17, world=1, on_gpu=True, longest_prompt=64)
    lora = plan_memory(_cfg("actor.lora.rank=16"), QWEN17, world=1, on_gpu=True, longest_prompt=64)
    count, params = lora_parameter_count(QWEN17, 16, "all-linear"), parameter_count(QWEN17)
    assert lora.optimizer == count * (8 + 4)  # fp32 Adam moments and master copy (bf16 run)
    assert lora.gradients == count * 2
    assert lora.actor_weights == (params + count) * 2
    assert full.reference_weights == params * 2 and lora.reference_weights == 0
    assert full.optimizer == params * 12 and lora.optimizer < full.optimizer / 50


def test_sleep_weights_is_refused():
    cfg = _cfg("actor.lora.rank=16")
    with pytest.raises(ValueError, match="rollout.engine.sleep=weights with actor.lora.rank"):
        engine = replace(cfg.rollout.engine, sleep="weights")
        replace(cfg, rollout=replace(cfg.rollout, engine=engine))
