"""Sizing to the device (sparrow/train/memory/fit.py): what is changed, in which order, what is
left as the user set it, and the one-line refusals naming the phase and the knob."""

from dataclasses import replace

import pytest

from sparrow.models.loading import tiny_model_config
from sparrow.models.shape import ModelShape
from sparrow.rl.actor_config import ActorConfig
from sparrow.rollout.engine import EngineConfig
from sparrow.train.config import MemoryConfig, RLConfig, RolloutConfig, SparrowConfig
from sparrow.train.memory.fit import (
    CHECKPOINTING,
    SLEEP,
    TOKEN_BUDGET,
    DeviceMemory,
    MemoryRefused,
    device_memory,
    fit_memory,
    rank_device_memory,
)
from sparrow.train.memory.plan import GiB, plan_memory

SHAPE = ModelShape.from_hf_config(tiny_model_config("qwen3"))
PROMPT = 1000  # longest prompt; rows of 1000 + 512 tokens


def cfg(num_pages=256, fit=True, **actor) -> SparrowConfig:
    return SparrowConfig(
        rollout=RolloutConfig(
            engine=EngineConfig(num_pages=num_pages, max_prefill_tokens=1024), max_new_tokens=512
        ),
        rl=RLConfig(group_size=8),
        actor=ActorConfig(
            **({"zero_stage": 0, "precision": "fp32", "micro_batch_size": 48} | actor)
        ),  # fmt: skip
        memory=MemoryConfig(fit=fit),
    )


def peak(c: SparrowConfig) -> int:
    return plan_memory(c, SHAPE, 1, False, PROMPT).peak_phase()[1]


def device(nbytes: int) -> DeviceMemory:
    return DeviceMemory(nbytes, "test device", headroom=0.0)


def fit(c: SparrowConfig, nbytes: int, pinned=frozenset(), sleep=False):
    """The actor knobs' tests keep the engine awake (rollout.engine.sleep as if pinned); the
    sleep's own pass `sleep=True`."""
    pinned = pinned if sleep else pinned | {SLEEP}
    return fit_memory(c, SHAPE, 1, False, device(nbytes), pinned, PROMPT)


def test_a_plan_that_fits_is_left_alone():
    c = cfg()
    fitted = fit(c, peak(c))
    assert fitted.cfg == c and fitted.changes == ()
    assert "sized" not in fitted.line()


def test_checkpointing_first_when_it_is_enough():
    c = cfg()
    checkpointed = peak(replace(c, actor=replace(c.actor, activation_checkpointing=True)))
    assert checkpointed < peak(c)
    fitted = fit(c, checkpointed)
    assert fitted.cfg.actor.activation_checkpointing
    assert fitted.cfg.actor.max_tokens_per_micro_batch == 0
    assert fitted.changes == (f"{CHECKPOINTING}=true",)
    assert f"sized to fit: {CHECKPOINTING}=true" in fitted.line()


def test_then_the_largest_token_budget_that_fits():
    c = cfg()
    on = replace(c, actor=replace(c.actor, activation_checkpointing=True))
    row = replace(on, actor=replace(on.actor, max_tokens_per_micro_batch=PROMPT + 512))
    limit = (peak(row) + peak(on)) // 2  # the longest row fits, 48 rows do not
    fitted = fit(c, limit)
    budget = fitted.cfg.actor.max_tokens_per_micro_batch
    assert fitted.changes == (f"{CHECKPOINTING}=true", f"{TOKEN_BUDGET}={budget}")
    assert budget % 256 == 0 and budget >= PROMPT + 512
    assert fitted.plan.peak_phase()[1] <= limit
    larger = replace(on, actor=replace(on.actor, max_tokens_per_micro_batch=budget + 256))
    assert peak(larger) > limit


def test_a_knob_set_on_the_command_line_is_not_sized():
    c = cfg()
    checkpointed = peak(replace(c, actor=replace(c.actor, activation_checkpointing=True)))
    fitted = fit(c, checkpointed, pinned=frozenset({CHECKPOINTING}))
    assert not fitted.cfg.actor.activation_checkpointing  # the budget was lowered instead
    assert fitted.changes[0].startswith(f"{TOKEN_BUDGET}=")
    with pytest.raises(MemoryRefused) as err:
        fit(c, checkpointed, pinned=frozenset({CHECKPOINTING, TOKEN_BUDGET}))
    message = str(err.value)
    assert "\n" not in message
    assert "actor step needs" in message and TOKEN_BUDGET in message and CHECKPOINTING in message
    assert "set on the command line" in message


def _sleeping(c: SparrowConfig, level: str) -> SparrowConfig:
    return replace(c, rollout=replace(c.rollout, engine=replace(c.rollout.engine, sleep=level)))


def test_the_engine_sleeps_first_when_that_is_enough():
    """Sleep (the pool freed through the actor phases) before checkpointing: it changes no
    result and recomputes nothing; the plan line says the engine sleeps and what it frees."""
    c = cfg(num_pages=4096)
    asleep = plan_memory(_sleeping(c, "kv"), SHAPE, 1, False, PROMPT)
    assert asleep.asleep == asleep.kv_pool + asleep.page_summaries + asleep.dense_copies
    assert asleep.peak_phase()[1] < peak(c)
    fitted = fit(c, asleep.peak_phase()[1], sleep=True)
    assert fitted.changes == (f"{SLEEP}=kv",) and fitted.cfg.rollout.engine.sleep == "kv"
    assert not fitted.cfg.actor.activation_checkpointing
    line = fitted.line()
    assert f"the engine sleeps through the actor phases ({SLEEP}=kv" in line
    assert f"sized to fit: {SLEEP}=kv" in line
    plan, awake = fitted.plan, plan_memory(c, SHAPE, 1, False, PROMPT)
    for name in ("actor log-probs", "actor step"):  # asleep there, awake for the rollout
        assert plan.phases[name] == awake.phases[name] - plan.asleep
    assert plan.phases["resident"] == awake.phases["resident"]
    with pytest.raises(MemoryRefused, match=f"set {SLEEP}=kv"):  # pinned off: named
        fit(c, asleep.peak_phase()[1], pinned=frozenset({CHECKPOINTING, TOKEN_BUDGET}))


def test_then_checkpointing_then_the_weights_asleep_too():
    c = cfg(num_pages=4096)
    on = replace(_sleeping(c, "kv"), actor=replace(c.actor, activation_checkpointing=True))
    weights = plan_memory(_sleeping(on, "weights"), SHAPE, 1, False, PROMPT)
    assert weights.asleep > plan_memory(on, SHAPE, 1, False, PROMPT).asleep
    fitted = fit(c, weights.peak_phase()[1], sleep=True)
    assert fitted.changes == (f"{CHECKPOINTING}=true", f"{SLEEP}=weights")
    # The speedup probe re-rolls out after the update with the rollout's weights: they stay.
    probed = replace(on, monitor=replace(on.monitor, speedup_every=2))
    assert plan_memory(_sleeping(probed, "weights"), SHAPE, 1, False, PROMPT).asleep == (
        plan_memory(probed, SHAPE, 1, False, PROMPT).asleep
    )


def test_an_async_producer_keeps_the_engine_awake():
    c = cfg(num_pages=4096)
    c = replace(c, rl=replace(c.rl, async_rollout=replace(c.rl.async_rollout, staleness=1)))
    asleep = plan_memory(_sleeping(cfg(num_pages=4096), "kv"), SHAPE, 1, False, PROMPT)
    fitted = fit(c, asleep.peak_phase()[1] * 2, sleep=True)
    assert fitted.cfg.rollout.engine.sleep == "off"
    with pytest.raises(ValueError, match="cannot sleep through it"):
        _sleeping(c, "kv")


def test_memory_fit_false_refuses_instead_of_sizing():
    c = cfg(fit=False)
    with pytest.raises(MemoryRefused, match="actor step needs .*memory.fit=true"):
        fit(c, peak(c) - 1)


def test_an_engine_phase_over_the_device_names_its_knob():
    c = cfg(num_pages=1 << 16)
    with pytest.raises(MemoryRefused, match=r"resident needs .*rollout.engine.num_pages"):
        fit(c, plan_memory(c, SHAPE, 1, False, PROMPT).kv_pool)


def test_a_longest_row_over_the_device_names_the_lengths():
    c = cfg()
    on = replace(c, actor=replace(c.actor, activation_checkpointing=True))
    row = replace(on, actor=replace(on.actor, max_tokens_per_micro_batch=PROMPT + 512))
    with pytest.raises(MemoryRefused, match=r"lower rollout.max_new_tokens=512 .*1512 tokens"):
        fit(c, peak(row) - 1)


def test_device_memory_sources(monkeypatch):
    assert device_memory(MemoryConfig(device_gib=80), on_gpu=True).bytes == 80 * GiB
    gpu = device_memory(MemoryConfig(), on_gpu=True)  # no GPU here: the H200
    assert gpu.bytes == 139 * GiB and "H200" in gpu.name
    host = device_memory(MemoryConfig(headroom=0.25), on_gpu=False)
    meminfo = open("/proc/meminfo").read()
    available = int(meminfo.split("MemAvailable:")[1].split()[0]) * 1024
    assert host.name == "host RAM" and host.bytes > available // 2
    assert host.usable == int(host.bytes * 0.75)
    # On CPU the process's own RSS is in the device's bytes and counted by the plan.
    assert host.runtime > 0 and gpu.runtime == 0


def test_the_default_run_on_a_smaller_machine_says_what_it_sized_and_why():
    """`sparrow-train dry_run=true memory.device_gib=8`: make train's config on an 8 GiB host
    turns on checkpointing, then lowers the token budget, and the plan line says so, with the
    phase and the bytes the configured plan needed."""
    from sparrow.cli.config_loader import load_config

    smollm2 = ModelShape(30, 576, 1536, 9, 3, 64, 49152, tied_embeddings=True)
    default = load_config([])
    small = DeviceMemory(8 * GiB, "memory.device_gib", headroom=0.1, runtime=GiB)
    fitted = fit_memory(default, smollm2, 1, False, small, frozenset({SLEEP}), 385, 366)
    budget = fitted.cfg.actor.max_tokens_per_micro_batch
    assert fitted.changes == (f"{CHECKPOINTING}=true", f"{TOKEN_BUDGET}={budget}")
    configured = plan_memory(default, smollm2, 1, False, 385, 366, GiB).peak_phase()
    assert fitted.configured == configured and configured[1] > small.usable
    assert fitted.plan.peak_phase()[1] <= small.usable < configured[1]
    line = fitted.line()
    assert f"sized to fit: {CHECKPOINTING}=true, {TOKEN_BUDGET}={budget}" in line
    assert f"(as configured, the actor step needs {configured[1] / GiB:.1f} GiB)" in line
    assert "of 7.2 GiB usable (memory.device_gib 8.0 GiB, 10% kept free)" in line


def test_ranks_on_one_cpu_host_plan_for_their_share_in_whole_gib(monkeypatch):
    """The trainer and the dry run both size a rank with this: three CPU ranks on one host each
    get a third of its memory, rounded down to whole GiB; a GPU rank has its own device."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert rank_device_memory(MemoryConfig(device_gib=20), on_gpu=False).bytes == 6 * GiB
    assert rank_device_memory(MemoryConfig(device_gib=20), on_gpu=True).bytes == 20 * GiB
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert rank_device_memory(MemoryConfig(device_gib=20), on_gpu=False).bytes == 20 * GiB
