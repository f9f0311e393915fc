"""Before the first rollout: the memory plan against the device's memory, and the actor knobs it
may change so that the plan fits, or a one-line refusal naming the phase and the knob.

    device = device_memory(cfg.memory, on_gpu=True)
    fitted = fit_memory(cfg, shape, world=1, on_gpu=True, device=device)  # or MemoryRefused
    fitted.cfg, fitted.line()

Only knobs that change memory and not the run's result are sized, in this order: the engine's
sleep through the actor phases (rollout.engine.sleep=kv: its KV pool freed and rebuilt empty,
generations bit-equal), the actor's activation checkpointing (recomputes layers in backward),
the engine's weight copy freed too (sleep=weights: pushed again at the sync), on a GPU
ZeRO-Offload (actor.offload_optimizer=cpu, then under ZeRO-3 offload_params=cpu: DeepSpeed's
CPUAdam steps the state in host RAM, equal to torch's AdamW to rounding, while host RAM holds it;
first when the optimizer state alone overfills the engine's phases) and the actor's
token budget per micro-batch (the GRPO loss is a sum over tokens, however the batch is cut). A
knob the user set on the command line (`pinned`) stays as set. Everything else (KV pool, prefill
size, ZeRO stage, ranks) changes what runs or where, and is named in the refusal instead.
"""

import os
from dataclasses import dataclass, replace
from typing import Any

from sparrow.models.shape import ModelShape
from sparrow.train.config import MemoryConfig, SparrowConfig
from sparrow.train.memory.offload import host_memory
from sparrow.train.memory.peaks import kib_fields
from sparrow.train.memory.plan import GiB, MemoryPlan, plan_memory

H200_BYTES = 139 * GiB
CHECKPOINTING = "actor.activation_checkpointing"
TOKEN_BUDGET = "actor.max_tokens_per_micro_batch"
SLEEP = "rollout.engine.sleep"
OFFLOAD_OPTIMIZER = "actor.offload_optimizer"
OFFLOAD_PARAMS = "actor.offload_params"
_ACTOR_PHASES = ("actor log-probs", "actor step")  # what the sized knobs change
_BUDGET_STEP = 256  # a sized token budget is a multiple of this


class MemoryRefused(ValueError):
    """The plan does not fit the device and cannot be sized to; str() is one line, `plan` the
    last plan tried."""

    def __init__(self, message: str, plan: MemoryPlan):
        super().__init__(message)
        self.plan = plan


@dataclass(frozen=True)
class DeviceMemory:
    bytes: int  # what the run may use, headroom not yet taken off
    name: str  # where the figure comes from, for the plan line
    headroom: float
    runtime: int = 0  # CPU: this process's resident size when measured, which the plan counts
    host: int = 0  # GPU: host RAM this rank may fill with offloaded state (offload.py)
    host_name: str = ""  # where that figure comes from

    @property
    def usable(self) -> int:
        return int(self.bytes * (1 - self.headroom))

    @property
    def host_usable(self) -> int:
        return int(self.host * (1 - self.headroom))


@dataclass(frozen=True)
class Fitted:
    cfg: SparrowConfig  # the run's config with the sized actor knobs
    plan: MemoryPlan
    device: DeviceMemory
    changes: tuple[str, ...]  # "key=value" of each knob sized
    configured: tuple[str, int] | None = None  # when sized: the peak phase of the plan as set

    def line(self) -> str:
        """The plan line: the peak phase against the device, and what was sized and why."""
        name, peak = self.plan.peak_phase()
        text = (
            f"memory: peak {peak / GiB:.1f} GiB ({name}) of {self.device.usable / GiB:.1f} GiB "
            f"usable ({self.device.name} {self.device.bytes / GiB:.1f} GiB, "
            f"{self.device.headroom:.0%} kept free)"
        )
        if self.plan.asleep:
            text += (
                f"; the engine sleeps through the actor phases ({SLEEP}={self.plan.sleep}, "
                f"{self.plan.asleep / GiB:.1f} GiB freed)"
            )
        if self.plan.host_offload:
            text += (
                f"; ZeRO-Offload holds {self.plan.host_offload / GiB:.1f} GiB in host RAM of "
                f"{self.device.host_usable / GiB:.1f} GiB usable ({self.device.host_name})"
            )
        if self.changes:
            text += "; sized to fit: " + ", ".join(self.changes)
        if self.configured:
            name, peak = self.configured
            text += f" (as configured, the {name} needs {peak / GiB:.1f} GiB)"
        return text


def device_memory(cfg: MemoryConfig, on_gpu: bool) -> DeviceMemory:
    """memory.device_gib when set; else the GPU's free memory, the H200's when a GPU run is
    planned without a GPU, or on CPU the host RAM available plus what this process holds already.
    On CPU the plan counts what the process holds (`runtime`: interpreter, libraries, tokenizer,
    prompts; the weights are memory-mapped from their safetensors and not read yet)."""
    import torch

    runtime = 0 if on_gpu else kib_fields("/proc/self/status").get("VmRSS", 0) * 1024
    if cfg.device_gib is not None:
        return DeviceMemory(int(cfg.device_gib * GiB), "memory.device_gib", cfg.headroom, runtime)
    if torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info()
        return DeviceMemory(free + torch.cuda.memory_allocated(), "GPU free", cfg.headroom)
    if on_gpu:
        return DeviceMemory(H200_BYTES, "H200 (no GPU here)", cfg.headroom)
    available = kib_fields("/proc/meminfo")["MemAvailable"] * 1024
    return DeviceMemory(available + runtime, "host RAM", cfg.headroom, runtime)


def rank_device_memory(cfg: MemoryConfig, on_gpu: bool) -> DeviceMemory:
    """device_memory as one rank of this launch sees it. Ranks on one host share its RAM: on CPU
    each plans for its share (LOCAL_WORLD_SIZE), rounded down to whole GiB so that ranks measuring
    a few MB apart size alike (sizing must agree: ranks take their micro-batches in step). With
    rollout ranks only the host's training ranks share it (SPARROW_LOCAL_TRAINERS, set by
    sparrow/cluster.py). A rollout rank's engine (one more copy of the weights and the KV pool)
    is not in the plan: on one CPU host memory.headroom must leave room for it."""
    device = device_memory(cfg, on_gpu)
    if on_gpu:
        host, host_name = host_memory(cfg, on_gpu)
        return replace(device, host=host, host_name=host_name)
    local = int(os.environ.get("SPARROW_LOCAL_TRAINERS", os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return replace(device, bytes=device.bytes // local // GiB * GiB)


def fit_memory(
    cfg: SparrowConfig,
    shape: ModelShape,
    world: int,
    on_gpu: bool,
    device: DeviceMemory,
    pinned: frozenset[str] = frozenset(),
    longest_prompt: int | None = None,
    common_prefix: int = 0,
) -> Fitted:
    """The plan of `cfg` if it fits `device`; else `cfg` with, until it fits, the engine asleep
    through the actor phases, checkpointing on, the engine's weights asleep too and the largest
    token budget that fits (each unless pinned or memory.fit=false); else MemoryRefused naming
    the phase over the device and the knob to change."""

    def plan(c: SparrowConfig) -> MemoryPlan:
        return plan_memory(c, shape, world, on_gpu, longest_prompt, common_prefix, device.runtime)

    usable = device.usable
    current = plan(cfg)
    configured = current.peak_phase()
    changes: list[str] = []
    if _peak(current) <= usable:
        return Fitted(cfg, _host_fits(current, device, cfg), device, ())
    free = cfg.memory.fit
    if free and _may_sleep(cfg, pinned, "off"):
        cfg, current = _sleep(cfg, "kv"), plan(_sleep(cfg, "kv"))
        changes.append(f"{SLEEP}=kv")
    # The optimizer state is in every phase: offloaded first when the engine's do not fit.
    if free and any(p > usable for n, p in current.phases.items() if n not in _ACTOR_PHASES):
        cfg, current = _offload(cfg, plan, pinned, device, changes)
    # What the actor knobs cannot shrink must fit first: the engine's phases.
    for name, peak in current.phases.items():
        if name not in _ACTOR_PHASES and peak > usable:
            knob = _engine_knob(name, current, cfg, world, bool(device.host))
            raise MemoryRefused(_refusal(name, peak, device, knob), current)
    checkpointed = cfg.actor.activation_checkpointing
    if _peak(current) > usable and free and CHECKPOINTING not in pinned and not checkpointed:
        cfg = replace(cfg, actor=replace(cfg.actor, activation_checkpointing=True))
        changes.append(f"{CHECKPOINTING}=true")
        current = plan(cfg)
    lora = cfg.actor.lora.rank > 0  # the base is never pushed again: its copy stays awake
    if _peak(current) > usable and free and _may_sleep(cfg, pinned, "kv") and not lora:
        weights = plan(_sleep(cfg, "weights"))
        if weights.asleep > current.asleep:  # else an engine pass keeps the copy (plan.py)
            cfg, current = _sleep(cfg, "weights"), weights
            changes = [c for c in changes if not c.startswith(SLEEP)] + [f"{SLEEP}=weights"]
    if _peak(current) > usable and free:
        cfg, current = _offload(cfg, plan, pinned, device, changes)
    if _peak(current) > usable and free and TOKEN_BUDGET not in pinned:
        budget = _largest_budget(cfg, plan, usable)
        if budget is None:  # not even the longest row alone: the refusal names the lengths
            budget = _longest_row(cfg, plan)
        cfg = replace(cfg, actor=replace(cfg.actor, max_tokens_per_micro_batch=budget))
        changes.append(f"{TOKEN_BUDGET}={budget}")
        current = plan(cfg)
    if _peak(current) > usable:
        name, peak = current.peak_phase()
        knob = _actor_knob(cfg, current, pinned, _longest_row(cfg, plan), bool(device.host))
        raise MemoryRefused(_refusal(name, peak, device, knob), current)
    return Fitted(
        cfg,
        _host_fits(current, device, cfg),
        device,
        tuple(changes),
        configured if changes else None,
    )


def _may_sleep(cfg: SparrowConfig, pinned: frozenset[str], level: str) -> bool:
    """Whether the fit may deepen the engine's sleep from `level`: it is not pinned, set deeper
    already, or refused (an in-process async producer draws beside the update)."""
    producer = cfg.rl.async_rollout.staleness and not cfg.cluster.rollout_ranks
    return SLEEP not in pinned and cfg.rollout.engine.sleep == level and not producer


def _sleep(cfg: SparrowConfig, level: str) -> SparrowConfig:
    engine = replace(cfg.rollout.engine, sleep=level)
    return replace(cfg, rollout=replace(cfg.rollout, engine=engine))


def _offload(
    cfg: SparrowConfig, plan, pinned: frozenset[str], device: DeviceMemory, changes: list[str]
) -> tuple[SparrowConfig, MemoryPlan]:
    """The fit's ZeRO-Offload step, on a GPU (device.host): the optimizer state to host RAM
    (ZeRO >= 1), then under ZeRO-3 the weights, each while the plan does not fit, unless set
    already, pinned, of no help (a small model's gathered layers can outweigh its ZeRO-3
    partition) or more than host RAM holds. Appends what it turns on to `changes`."""
    current = plan(cfg)
    for key, name, stage in ((OFFLOAD_OPTIMIZER, "offload_optimizer", 1),
                             (OFFLOAD_PARAMS, "offload_params", 3)):  # fmt: skip
        done = getattr(cfg.actor, name) != "none" or key in pinned or cfg.actor.zero_stage < stage
        if done or not device.host or _peak(current) <= device.usable:
            continue
        offload: dict[str, Any] = {name: "cpu"}  # a str field named at run time
        trial = replace(cfg, actor=replace(cfg.actor, **offload))
        offloaded = plan(trial)
        if offloaded.host_offload <= device.host_usable and _peak(offloaded) < _peak(current):
            cfg, current = trial, offloaded
            changes.append(f"{key}=cpu")
    return cfg, current


def _host_fits(plan: MemoryPlan, device: DeviceMemory, cfg: SparrowConfig) -> MemoryPlan:
    """`plan`, or MemoryRefused when the state it offloads overfills host RAM."""
    if plan.host_offload > device.host_usable:  # 0 on CPU, where the host is the device
        raise MemoryRefused(
            f"memory plan does not fit the host: ZeRO-Offload holds "
            f"{plan.host_offload / GiB:.1f} GiB in host RAM of {device.host_usable / GiB:.1f} GiB "
            f"usable ({device.host_name}, {device.headroom:.0%} kept free): set "
            f"{_offloaded_keys(cfg)}, raise memory.host_gib if the host has more, or add ranks",
            plan,
        )
    return plan


def _offloaded_keys(cfg: SparrowConfig) -> str:
    keys = [OFFLOAD_OPTIMIZER] + ([OFFLOAD_PARAMS] if cfg.actor.offload_params == "cpu" else [])
    return " or ".join(f"{k}=none" for k in reversed(keys))


def _longest_row(cfg: SparrowConfig, plan) -> int:
    """Tokens of the longest row, which runs alone however small the budget."""
    return plan(replace(cfg, actor=replace(cfg.actor, max_tokens_per_micro_batch=1))).actor_tokens


def _largest_budget(cfg: SparrowConfig, plan, usable: int) -> int | None:
    """The largest token budget whose plan fits: a multiple of _BUDGET_STEP, or the longest row
    when no multiple of at least that fits; None if even the longest row's plan does not."""

    def fits(budget: int) -> bool:
        sized = replace(cfg, actor=replace(cfg.actor, max_tokens_per_micro_batch=budget))
        return _peak(plan(sized)) <= usable

    row = _longest_row(cfg, plan)
    if not fits(row):
        return None
    low = -(-row // _BUDGET_STEP)  # in steps: the smallest multiple at least the row
    if not fits(low * _BUDGET_STEP):
        return row
    uncut = plan(cfg)  # a budget of its decoder tokens and rows x prompt cuts nothing
    high = -(-max(row, uncut.actor_tokens, uncut.actor_expanded) // _BUDGET_STEP) + 1
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid * _BUDGET_STEP) else (low, mid)
    return low * _BUDGET_STEP


def _peak(plan: MemoryPlan) -> int:
    return plan.peak_phase()[1]


def _refusal(phase: str, peak: int, device: DeviceMemory, knob: str) -> str:
    return (
        f"memory plan does not fit: {phase} needs {peak / GiB:.1f} GiB of "
        f"{device.usable / GiB:.1f} GiB usable ({device.name} {device.bytes / GiB:.1f} GiB, "
        f"{device.headroom:.0%} kept free): {knob}"
    )


def _engine_knob(phase: str, plan: MemoryPlan, cfg: SparrowConfig, world: int, gpu: bool) -> str:
    eng = cfg.rollout.engine
    if phase == "prefill peak":
        return (
            f"lower rollout.engine.max_prefill_tokens={eng.max_prefill_tokens} or "
            f"data.max_prompt_tokens={cfg.data.max_prompt_tokens} (prefill "
            f"{plan.prefill_extra / GiB:.1f} GiB)"
        )
    if phase == "decode peak":
        return f"lower rollout.engine.max_batch_size={eng.max_batch_size}"
    if phase == "monitor exact":  # its pass takes micro_batch_size rows, not the token budget
        return (
            f"lower actor.micro_batch_size={cfg.actor.micro_batch_size} (the exact acceptance's "
            f"rows per pass) or monitor.exact_fraction={cfg.monitor.exact_fraction}, or set "
            "monitor.exact=false"
        )
    if phase == "distill step":  # DistillSparse's micro-batch: no actor knob sizes it
        return (
            f"lower distill.micro_batch_size={cfg.distill.micro_batch_size} (planned "
            f"{plan.distill_rows} rows per sparse forward + backward, "
            f"{plan.distill_extra / GiB:.1f} GiB) or rollout.max_new_tokens="
            f"{cfg.rollout.max_new_tokens}, or set distill=disabled"
        )
    # "resident": weights, optimizer state and the engine's pool; name the larger share.
    weights = plan.actor_weights + plan.engine_weights + plan.optimizer + plan.distill_weights
    if plan.kv_pool + plan.page_summaries >= weights:
        return (
            f"lower rollout.engine.num_pages={eng.num_pages} (KV pool and page summaries "
            f"{(plan.kv_pool + plan.page_summaries) / GiB:.1f} GiB)"
        )
    offload = gpu and cfg.actor.offload_optimizer == "none" and cfg.actor.zero_stage >= 1
    return (
        (f"set {OFFLOAD_OPTIMIZER}=cpu, " if offload else "")
        + f"raise actor.zero_stage={cfg.actor.zero_stage} or the ranks ({world}), or use a smaller "
        f"model (weights and optimizer state {weights / GiB:.1f} GiB)"
    )


def _actor_knob(
    cfg: SparrowConfig, plan: MemoryPlan, pinned: frozenset[str], row: int, gpu: bool
) -> str:
    advice = []
    deeper = {"off": "kv", "kv": "weights"}.get(cfg.rollout.engine.sleep)
    if deeper:
        advice.append(f"set {SLEEP}={deeper}")
    if not cfg.actor.activation_checkpointing:
        advice.append(f"set {CHECKPOINTING}=true")
    if gpu and cfg.actor.offload_optimizer == "none" and cfg.actor.zero_stage >= 1:
        advice.append(f"set {OFFLOAD_OPTIMIZER}=cpu")
    if plan.actor_tokens > row:
        advice.append(f"lower {TOKEN_BUDGET} (plans {plan.actor_tokens} tokens per micro-batch)")
    else:
        advice.append(
            f"lower rollout.max_new_tokens={cfg.rollout.max_new_tokens} or "
            f"data.max_prompt_tokens={cfg.data.max_prompt_tokens} (the longest row, {row} "
            f"tokens, is one micro-batch), or raise actor.zero_stage={cfg.actor.zero_stage} or "
            "the ranks"
        )
    text = " or ".join(advice)
    if not cfg.memory.fit:
        text += ", or let memory.fit=true size them"
    elif pinned & {CHECKPOINTING, TOKEN_BUDGET, SLEEP, OFFLOAD_OPTIMIZER, OFFLOAD_PARAMS}:
        text += " (set on the command line, so not sized)"
    return text
