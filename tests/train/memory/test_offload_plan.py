"""ZeRO-Offload in the memory plan and fit (sparrow/train/memory/offload.py, plan.py, fit.py): on a
GPU the optimizer state leaves every phase for host RAM, which the plan counts apart and checks;
the fit turns it on after checkpointing and before the token budget, only while host RAM holds
it; on CPU, where the host is the device, nothing moves."""

from dataclasses import replace

import pytest

from sparrow.models.loading import ModelConfig, tiny_model_config
from sparrow.models.shape import ModelShape
from sparrow.rl.actor_config import ActorConfig
from sparrow.rollout.engine import EngineConfig
from sparrow.train.config import MemoryConfig, RLConfig, RolloutConfig, SparrowConfig
from sparrow.train.memory.fit import (
    CHECKPOINTING,
    OFFLOAD_OPTIMIZER,
    OFFLOAD_PARAMS,
    SLEEP,
    TOKEN_BUDGET,
    DeviceMemory,
    MemoryRefused,
    fit_memory,
)
from sparrow.train.memory.offload import DGX_HOST_PER_GPU, host_memory
from sparrow.train.memory.plan import GiB, parameter_count, plan_memory

SHAPE = ModelShape.from_hf_config(tiny_model_config("qwen3"))
PROMPT = 1000
WORLD = 4


def cfg(**actor) -> SparrowConfig:
    return SparrowConfig(
        model=ModelConfig(name="tiny-qwen3", dtype="bfloat16"),
        rollout=RolloutConfig(
            engine=EngineConfig(num_pages=256, max_prefill_tokens=1024), max_new_tokens=512
        ),
        rl=RLConfig(group_size=8),
        actor=ActorConfig(
            **({"zero_stage": 2, "precision": "bf16", "micro_batch_size": 48} | actor)
        ),
    )


def plan(c: SparrowConfig, on_gpu: bool = True):
    return plan_memory(c, SHAPE, WORLD, on_gpu, PROMPT)


def with_actor(c: SparrowConfig, **actor) -> SparrowConfig:
    return replace(c, actor=replace(c.actor, **actor))


def fit(c: SparrowConfig, device_bytes: int, host_bytes: int, pinned=frozenset()):
    device = DeviceMemory(device_bytes, "test device", 0.0, host=host_bytes, host_name="test host")
    return fit_memory(c, SHAPE, WORLD, True, device, pinned | {SLEEP}, PROMPT)


def test_offload_moves_the_optimizer_state_from_every_phase_to_host_ram():
    plain, offloaded = plan(cfg()), plan(cfg(offload_optimizer="cpu"))
    trained = parameter_count(SHAPE) // WORLD  # ZeRO partitions the state over the ranks
    assert plain.optimizer == parameter_count(SHAPE) * 12 // WORLD  # m, v, fp32 master
    assert offloaded.optimizer == 0
    # fp32 master, m, v and the fp32 gradient partition, 16 bytes a value (rounding: //)
    assert abs(offloaded.host_offload - 16 * trained) <= 16
    for name, bytes_ in plain.phases.items():  # the tiny gradients fit one reduce bucket
        assert offloaded.phases[name] == bytes_ - plain.optimizer
    assert "offloaded to host RAM" in offloaded.table(GiB, "test")
    # On CPU the host is the device: the state stays in the phases, with what offload adds.
    cpu_plain, cpu = plan(cfg(precision="fp32"), False), plan(cfg(offload_optimizer="cpu"), False)
    assert cpu.host_offload == 0 and cpu.optimizer == 2 * cpu_plain.optimizer


def test_zero3_weight_offload_keeps_only_the_gathered_layers():
    zero3 = cfg(zero_stage=3, offload_optimizer="cpu")
    both = plan(with_actor(zero3, offload_params="cpu"))
    assert both.host_offload == plan(zero3).host_offload + plan(zero3).actor_weights
    # DeepSpeed may keep up to stage3_max_live_parameters gathered: the whole tiny model.
    assert both.actor_weights == parameter_count(SHAPE) * 2


def test_the_fit_offloads_after_checkpointing_and_before_the_token_budget():
    c = cfg()
    on = with_actor(c, activation_checkpointing=True)
    offloaded = plan(with_actor(on, offload_optimizer="cpu"))
    limit = offloaded.peak_phase()[1]
    assert plan(on).peak_phase()[1] > limit  # checkpointing alone is not enough
    fitted = fit(c, limit, host_bytes=GiB)
    assert fitted.changes == (f"{CHECKPOINTING}=true", f"{OFFLOAD_OPTIMIZER}=cpu")
    assert fitted.cfg.actor.offload_optimizer == "cpu"
    assert fitted.cfg.actor.max_tokens_per_micro_batch == 0  # micro-batches left whole
    line = fitted.line()
    assert f"sized to fit: {CHECKPOINTING}=true, {OFFLOAD_OPTIMIZER}=cpu" in line
    assert f"ZeRO-Offload holds {offloaded.host_offload / GiB:.1f} GiB in host RAM" in line
    # Host RAM too small for the state: no offload, the token budget instead.
    small = fit(c, limit, host_bytes=offloaded.host_offload - 1)
    assert small.cfg.actor.offload_optimizer == "none"
    assert small.changes[-1].startswith(f"{TOKEN_BUDGET}=")
    # Pinned off (set on the command line): the budget, and a refusal names it if that fails.
    pinned = fit(c, limit, host_bytes=GiB, pinned=frozenset({OFFLOAD_OPTIMIZER}))
    assert pinned.cfg.actor.offload_optimizer == "none"
    # ZeRO-3: the tiny model's gathered layers outweigh its weight partition, so the fit
    # offloads its optimizer state only (a 1.7B+ model's partition is the larger).
    z3 = fit(with_actor(c, zero_stage=3), limit, host_bytes=GiB)
    assert z3.cfg.actor.offload_optimizer == "cpu" and z3.cfg.actor.offload_params == "none"


def test_offloaded_state_over_host_ram_is_refused_in_one_line():
    c = cfg(offload_optimizer="cpu")
    offloaded = plan(c)
    with pytest.raises(MemoryRefused) as err:
        fit(c, 2**40, host_bytes=offloaded.host_offload - 1)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("memory plan does not fit the host: ZeRO-Offload holds")
    assert f"{OFFLOAD_OPTIMIZER}=none" in message and OFFLOAD_PARAMS not in message


def test_host_ram_sources(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert host_memory(MemoryConfig(host_gib=512), on_gpu=True) == (
        128 * GiB, "memory.host_gib / 4 ranks"
    )  # fmt: skip
    assert host_memory(MemoryConfig(), on_gpu=False) == (0, "")  # CPU: the host is the device
    import torch

    if not torch.cuda.is_available():  # a GPU config planned here: a DGX node's share
        assert host_memory(MemoryConfig(), on_gpu=True)[0] == DGX_HOST_PER_GPU
    with pytest.raises(ValueError, match="memory.host_gib must be > 0"):
        MemoryConfig(host_gib=0)
