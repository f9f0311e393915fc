"""ZeRO-Offload through DenseActor (actor.offload_optimizer / actor.offload_params): DeepSpeed's
own offload holds the optimizer state on the host and steps it with its CPUAdam, and the update
equals the one without offload.

On a CPU-only machine every tensor is on the CPU with or without offload, so a tensor's device
cannot tell them apart: the tests read DeepSpeed's own offload structures instead (the engine's
offload config, the ZeRO optimizer's offload flags, CPUAdam as the inner optimizer, the AdamW
moments on the fp32 partitions it steps on the host). A DeepSpeed config without the offload key
fails every one of them. With CUDA the same test also sees the moments on the host while the
weights are on the GPU. DeepSpeed's CPUAdam is a C++ op JIT-built on first use (about 2 min on
2 cores, then cached under $TORCH_EXTENSIONS_DIR). The fake-CUDA rehearsal does not run DeepSpeed
(tests/rehearsal/trainer_rehearsal.py), so it does not cover offload.
"""

import pytest
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam
from tiny_lm import pg_loss_fn, rl_batch, tiny_causal_lm

from sparrow.rl.actor import DenseActor
from sparrow.rl.actor_config import ActorConfig

# Max |weight difference| after 3 updates at lr 1e-3 (an update moves weights by ~3e-3):
# DeepSpeed's CPUAdam and torch's AdamW round differently. Measured 6.3e-6 (ZeRO-2) and 3.9e-7
# (ZeRO-3, weights offloaded too) on a 2-core AVX-512 Xeon VM, torch 2.13.0+cpu, DeepSpeed 0.19.8.
WEIGHT_ATOL = 2e-5


def make_actor(**overrides) -> DenseActor:
    cfg = {"zero_stage": 2, "lr": 1e-3, "micro_batch_size": 3, "precision": "fp32"}
    return DenseActor(tiny_causal_lm("qwen3"), ActorConfig(**(cfg | overrides)))


def train(actor: DenseActor, steps: int = 3) -> list[dict[str, float]]:
    metrics = []
    for step in range(steps):
        batch = rl_batch(6, 12, seed=step)
        loss_fn = pg_loss_fn(int(batch["completion_mask"].sum()))
        metrics.append(actor.train_step(actor.micro_batches(batch), loss_fn))
    return metrics


def host_moments(actor: DenseActor) -> list[torch.Tensor]:
    """The AdamW moments of the fp32 partitions DeepSpeed's ZeRO optimizer steps."""
    opt = actor.engine.optimizer
    if actor.cfg.zero_stage == 3:
        fp32 = opt.fp32_partitioned_groups_flat
    else:
        fp32 = opt.single_partition_of_fp32_groups
    states = [opt.optimizer.state[p] for p in fp32]
    assert all(s for s in states), "the inner optimizer holds no state for the fp32 partitions"
    return [s[k] for s in states for k in ("exp_avg", "exp_avg_sq")]


@pytest.mark.parametrize(
    "zero",
    [
        {"zero_stage": 2, "offload_optimizer": "cpu"},
        {"zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu"},
    ],
    ids=["zero2", "zero3-params"],
)
def test_offloaded_optimizer_state_lives_on_the_host(zero):
    actor = make_actor(**zero)
    train(actor, steps=1)
    engine, opt = actor.engine, actor.engine.optimizer
    # DeepSpeed's engine took the offload from the config, and its ZeRO optimizer runs it.
    assert engine.zero_offload_optimizer() is not None, "the DeepSpeed config lost the offload"
    assert engine.zero_offload_optimizer().device == "cpu"
    offloaded = opt.offload_optimizer if zero["zero_stage"] == 3 else opt.cpu_offload
    assert offloaded, "DeepSpeed's ZeRO optimizer does not offload"
    assert isinstance(opt.optimizer, DeepSpeedCPUAdam)  # DeepSpeed steps it on the host
    moments = host_moments(actor)
    assert all(m.device.type == "cpu" and m.dtype == torch.float32 for m in moments)
    assert all(m.abs().sum() > 0 for m in moments)  # the step wrote them
    weights = [p.device.type for p in actor.model.parameters()]
    assert set(weights) == {engine.device.type}  # cuda under a GPU: only the state moved
    if zero.get("offload_params") == "cpu":
        params = engine.zero_offload_param()
        assert params is not None and params.device == "cpu", "the config lost offload_param"
        assert opt.offload_param, "DeepSpeed's ZeRO-3 does not offload the weight partition"


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_offload_gives_the_same_updates(zero_stage):
    params = {"offload_params": "cpu"} if zero_stage == 3 else {}
    plain = make_actor(zero_stage=zero_stage)
    offload = make_actor(zero_stage=zero_stage, offload_optimizer="cpu", **params)
    plain_metrics, offload_metrics = train(plain), train(offload)
    initial = tiny_causal_lm("qwen3").state_dict()
    a, b = plain.gathered_state_dict(), offload.gathered_state_dict()
    assert max(float((a[k] - initial[k]).abs().max()) for k in a) > 1e-3  # it did train
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert diff <= WEIGHT_ATOL, f"offload moved the weights by {diff:.2e}"
    for m_plain, m_offload in zip(plain_metrics, offload_metrics, strict=True):
        assert m_offload["skipped"] == 0
        for key in ("loss", "grad_norm", "entropy"):
            assert m_offload[key] == pytest.approx(m_plain[key], rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"zero_stage": 0, "offload_optimizer": "cpu"}, "needs actor.zero_stage >= 1"),
        ({"zero_stage": 2, "offload_params": "cpu"}, "needs actor.zero_stage=3"),
        ({"zero_stage": 2, "offload_optimizer": "nvme"}, "must be none or cpu"),
    ],
)
def test_combinations_offload_cannot_run_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        ActorConfig(**overrides)
