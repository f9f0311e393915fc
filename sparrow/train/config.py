"""The run configuration: one typed dataclass tree, composed by Hydra at the CLI edge.

Each component owns its config dataclass (fields documented there); this module only groups them
the way conf/ does (model, data, rollout, schedule, controller, monitor, rl, actor, distill,
logger) and adds the run-level fields. Library code receives these dataclasses, never a DictConfig.
"""

import os
from dataclasses import dataclass, field

from sparrow.cluster import PUSH_BACKENDS
from sparrow.control.controller import ControllerConfig, resolve_objective
from sparrow.control.schedule import ScheduleConfig
from sparrow.distill.distill_sparse import DistillConfig
from sparrow.models.loading import ModelConfig
from sparrow.monitor.config import MonitorConfig
from sparrow.rl.actor_config import ActorConfig
from sparrow.rl.advantages import AdvantageConfig
from sparrow.rl.losses import LossConfig
from sparrow.rl.overlong import OverlongConfig
from sparrow.rl.rollout_correction import CorrectionConfig
from sparrow.rollout.engine import EngineConfig
from sparrow.rollout.speculative import SpeculativeConfig
from sparrow.tasks.data import DataConfig
from sparrow.tasks.rewards import RewardConfig
from sparrow.train.logs.metrics_logger import LoggerConfig


@dataclass
class RolloutConfig:
    engine: EngineConfig = field(default_factory=EngineConfig)  # the inference engine
    # Lossless sparse rollouts: sparse decode drafts, one dense pass verifies (speculative.py)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    temperature: float = 1.0  # sampling temperature of training rollouts (the paper: 1)
    top_p: float = 1.0  # nucleus mass; < 1: IS weights use the truncated log-prob drawn from
    top_k: int | None = None  # keep the k most likely tokens; None keeps all
    max_new_tokens: int = 48  # completion length cap
    ignore_eos: bool = False  # generate max_new_tokens always (fixed-length benchmarks)
    progress: bool = True  # tqdm bar over the rollout

    def __post_init__(self):
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.max_new_tokens < 1:
            raise ValueError(
                "rollout needs temperature >= 0, 0 < top_p <= 1 and max_new_tokens >= 1, got "
                f"{self.temperature}, {self.top_p}, {self.max_new_tokens}"
            )
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"rollout.top_k must be >= 1 or null, got {self.top_k}")


@dataclass
class EvalConfig:
    every: int = 0  # evaluate held-out accuracy every this many steps (and before/after); 0: off
    split: str = "heldout"  # data split used for evaluation
    num_prompts: int = 200  # held-out prompts evaluated (all of them if fewer)
    temperature: float = 0.0  # 0: greedy; with samples > 1, the temperature of the k samples
    max_new_tokens: int = 48  # completion length cap at evaluation
    # k > 1: also k samples per prompt at `temperature`, scored as pass@j (j = 2, 4, ..., k) and
    # mean@k beside the greedy accuracy (sparrow/train/evaluation.py); 1: accuracy alone.
    samples: int = 1

    def __post_init__(self):
        if self.every < 0 or self.num_prompts < 0 or self.temperature < 0:
            raise ValueError(
                "rl.eval.every, rl.eval.num_prompts and rl.eval.temperature must be >= 0, got "
                f"{self.every}, {self.num_prompts}, {self.temperature}"
            )
        if self.samples < 1 or (self.samples > 1 and self.temperature == 0):
            raise ValueError(
                f"rl.eval.samples={self.samples} at rl.eval.temperature={self.temperature}: "
                "samples must be >= 1, and k > 1 samples need a temperature > 0 (greedy ones "
                "are all the same), e.g. rl.eval.temperature=0.6"
            )
        if self.max_new_tokens < 1:
            raise ValueError(f"rl.eval.max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class DynamicSamplingConfig:
    # Draw rounds of rl.prompts_per_step prompts until the step holds that many groups whose
    # rewards are not all equal (DAPO's dynamic sampling); off: one round, every group trained.
    enabled: bool = False
    max_rounds: int = 4  # rounds per step at most; then the step trains on what it kept

    def __post_init__(self):
        if self.max_rounds < 1:
            raise ValueError(f"rl.dynamic_sampling.max_rounds must be >= 1, got {self.max_rounds}")


@dataclass
class AsyncConfig:
    """Rollout overlapped with the update (sparrow/train/rollouts/pipeline.py). The CLI key is
    `rl.async.staleness` (`async` is a Python keyword: the field is `rl.async_rollout`, and the
    CLI rewrites one key into the other, sparrow/cli/config_loader.py)."""

    # 0: the synchronous loop (rollout, then update, one after the other). 1: the rollout of step
    # t+1 runs in a background thread while step t updates, from the engine's weights before that
    # update, so step t+1 trains on rows one weight version old; the acceptance the controller
    # reads then compares each row's sparse and dense distributions of the SAME weights (its
    # dense replay on the rollout side, docs/DESIGN.md). One process runs one rollout ahead: k > 1
    # would need older weights kept, so it is refused.
    staleness: int = 0

    def __post_init__(self):
        if self.staleness not in (0, 1):
            raise ValueError(
                f"rl.async.staleness={self.staleness}: 0 (synchronous) or 1 (the next rollout "
                "overlaps the update, one weight version old) on one process"
            )


@dataclass
class RLConfig:
    steps: int = 20  # GRPO steps (one rollout batch and one optimizer update each)
    prompts_per_step: int = 8  # prompts per step over all ranks
    group_size: int = 8  # samples per prompt (the GRPO group)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    # How each token's loss is weighted for having been sampled by the rollout engine (TIS by
    # default; the modes are in sparrow/rl/rollout_correction.py).
    correction: CorrectionConfig = field(default_factory=CorrectionConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    save_every: int = 10  # checkpoint every this many steps (and at the end); 0: only at the end
    keep_last: int = 2  # complete checkpoints kept
    max_nonfinite_streak: int = 3  # consecutive skipped (NaN/Inf) updates that stop the run
    # A step whose advantages are all zero (every group's rewards equal) has a zero gradient,
    # but AdamW would still move the weights on its momentum, repeating the last real update
    # (sparrow.experiments.zero_signal_drift). Skip such an update: weights and optimizer state
    # stay as they are, and the LR schedule does not advance.
    skip_no_signal: bool = True
    # false: theta stays as loaded (no optimizer step, no weight sync to the engine) while
    # rollouts, dense log-probs, acceptance, the controller and DistillSparse run as usual:
    # distill-only training (sparrow.experiments.distill_study).
    update_policy: bool = True
    # Where the step's dense log-probs come from (sparrow/train/policy_update.py, dense_pass):
    # "update": the update's own forward gives them, detached (the old log-probs, so the PPO
    # ratio is exactly 1; top-K, entropy and the monitor's exact acceptance too), since a batch
    # feeds one optimizer step; it falls back to "separate" where a reader needs them before the
    # loss (rl.correction.mode=seq_mask rejects rows first) or no update runs (update_policy
    # false, or a step skipped for want of signal). "separate": a no-grad pass before the update.
    dense_pass: str = "update"
    # DAPO's dynamic sampling: rounds of prompts until the step holds prompts_per_step groups
    # with signal (sparrow/train/dynamic_sampling.py).
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    # DAPO's soft overlong penalty and overlong filtering (sparrow/rl/overlong.py); off.
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    # Asynchronous rollout, the CLI's `rl.async.staleness` (AsyncConfig above); 0: synchronous.
    async_rollout: AsyncConfig = field(default_factory=AsyncConfig)

    def __post_init__(self):
        # prompts_per_step's upper bound (the data size) is checked by the prompt iterator.
        at_least_one = {
            "prompts_per_step": self.prompts_per_step,
            "group_size": self.group_size,
            "keep_last": self.keep_last,
            "max_nonfinite_streak": self.max_nonfinite_streak,
        }
        if self.dense_pass not in ("update", "separate"):
            raise ValueError(f"rl.dense_pass={self.dense_pass!r}: 'update' or 'separate'")
        bad = {k: v for k, v in at_least_one.items() if v < 1}
        if bad or self.save_every < 0 or self.steps < 0:
            raise ValueError(
                f"rl.{', rl.'.join(bad) or 'save_every/steps'} must be >= 1 (save_every and "
                f"steps >= 0), got {bad or (self.save_every, self.steps)}"
            )


@dataclass
class EnvConfig:
    """Multi-turn episodes with tools (sparrow/rollout/episodes.py, sparrow/tasks/environment.py):
    `env=calculator` / `env=python` pick the built-ins (conf/env/)."""

    # The environment factory: a built-in name (calculator, python), path/to/file.py:make_env or
    # package.module:make_env; null: single-turn completions scored by rl.reward.
    function: str | None = None
    max_turns: int = 4  # assistant turns per episode; the last one's reward still counts
    max_observation_tokens: int = 256  # per observation; longer contents are cut and marked
    # Prompt + every turn + every observation; an episode that reaches it ends with finish
    # reason "length", as an overlong completion (rl.overlong applies). 0: the longest prompt +
    # max_turns x rollout.max_new_tokens + (max_turns - 1) x max_observation_tokens.
    max_context_tokens: int = 0
    timeout_s: float = 10.0  # per reset or step of an environment; past it, an error observation
    isolate: bool = False  # build and run the environments in the sandbox worker
    max_observation_chars: int = 65536  # per message, before tokenizing (a 10 MB result is cut)

    def __post_init__(self):
        if self.max_turns < 1 or self.max_observation_tokens < 1 or self.max_context_tokens < 0:
            raise ValueError(
                "env.max_turns and env.max_observation_tokens must be >= 1 and "
                f"env.max_context_tokens >= 0, got {self.max_turns}, "
                f"{self.max_observation_tokens}, {self.max_context_tokens}"
            )
        if self.timeout_s <= 0 or self.max_observation_chars < 1:
            raise ValueError(
                f"env.timeout_s must be > 0 and env.max_observation_chars >= 1, got "
                f"{self.timeout_s}, {self.max_observation_chars}"
            )

    def context_tokens(self, longest_prompt: int, max_new_tokens: int) -> int:
        """The episode's context limit in tokens (max_context_tokens, or what it defaults to)."""
        if self.max_context_tokens:
            return self.max_context_tokens
        turns = self.max_turns
        return longest_prompt + turns * max_new_tokens + (turns - 1) * self.max_observation_tokens


@dataclass
class MemoryConfig:
    """How the run's memory plan (sparrow/train/memory/plan.py) meets the device before step 1."""

    # The device's memory in GiB; null: measured (GPU: free device memory; CPU: host RAM
    # available to this process), or the H200's 139 GiB when a GPU config has no GPU (a dry run).
    device_gib: float | None = None
    # A GPU run's host RAM in GiB, shared by the host's ranks, for what actor.offload_optimizer /
    # offload_params move there; null: measured beside a GPU, a DGX's 2 TiB per 8 GPUs without.
    host_gib: float | None = None
    headroom: float = 0.1  # share of the device the plan leaves free (allocator, runtime, caches)
    # Turn on actor.activation_checkpointing and lower actor.max_tokens_per_micro_batch until the
    # plan fits (knobs set on the command line stay as set); false: refuse a plan that does not.
    # On a GPU it may also put the engine to sleep and offload the optimizer state (ZeRO >= 1).
    fit: bool = True
    # Log memory/peak_gib/<phase> each step, the most each phase held (train/memory/peaks.py): the
    # process's peak RSS (VmHWM) is reset at each phase, so /usr/bin/time's maximum resident size
    # and ru_maxrss then hold the last phase's peak only, not the run's; CUDA's peak statistics
    # likewise. Off: they stay the run's peak.
    measure_phases: bool = False

    def __post_init__(self):
        if self.host_gib is not None and self.host_gib <= 0:
            raise ValueError(f"memory.host_gib must be > 0, got {self.host_gib}")
        if not 0 <= self.headroom < 1 or (self.device_gib is not None and self.device_gib <= 0):
            raise ValueError(
                f"memory.headroom must be in [0, 1) and memory.device_gib > 0, got "
                f"{self.headroom} and {self.device_gib}"
            )


@dataclass
class ClusterConfig:
    """How a torchrun world splits into rollout and training ranks (sparrow/cluster.py)."""

    # R > 0: the world's last R ranks run only the rollout engine (no actor, no optimizer state)
    # and the others train; after each update training rank 0 pushes the new weights to them
    # (sparrow/rollout/weight_push.py). 0: every rank trains and rolls out its own share.
    rollout_ranks: int = 0
    push_bucket_mb: float = 64.0  # the weight push's bucket: the most a ZeRO-3 rank gathers
    # How long a rank waits on the rollout bridge. A rollout rank waits there between requests,
    # through the trainers' longest gap (an evaluation, a checkpoint), so it outlasts the actor's
    # collective timeout; a dead peer closes its connection and is seen at once anyway.
    bridge_timeout_min: float = 120.0
    # The push's transport. auto: NCCL when every rank has a GPU of its own, else gloo (CPU
    # ranks, or a host with fewer GPUs than ranks, e.g. 1 rollout + 1 training rank sharing
    # one GPU: NCCL refuses two ranks on one GPU). The bridge (requests, rows) is always gloo.
    push_backend: str = "auto"  # auto | nccl | gloo

    def __post_init__(self):
        if self.rollout_ranks < 0 or self.push_bucket_mb <= 0 or self.bridge_timeout_min <= 0:
            raise ValueError(
                f"cluster.rollout_ranks must be >= 0 and cluster.push_bucket_mb, "
                f"cluster.bridge_timeout_min > 0, got {self.rollout_ranks}, "
                f"{self.push_bucket_mb}, {self.bridge_timeout_min}"
            )
        if self.push_backend not in PUSH_BACKENDS:
            raise ValueError(
                f"cluster.push_backend must be auto, nccl or gloo, got {self.push_backend!r}"
            )


RESUME_MODES = ("auto", "never")  # or a checkpoint path


@dataclass
class SparrowConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)  # the dense policy's trainer
    distill: DistillConfig = field(default_factory=DistillConfig)  # LoRA for the sparse policy
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)  # the plan against the device
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  # rollout ranks apart
    env: EnvConfig = field(default_factory=EnvConfig)  # multi-turn episodes with tools; off
    run_dir: str = "runs/default"  # checkpoints, metrics.jsonl, W&B files, the exported policy
    # The root of every random stream: sampling, prompt order, evaluation, DistillSparse, the
    # global generators (sparrow/train/run/seeds.py); a component's own seed set explicitly wins.
    seed: int = 0
    resume: str = "auto"  # auto: newest complete checkpoint in run_dir if any | never | a path
    # refuse: resuming a run dir whose stored config differs in a key that changes the run
    # (model, data, batch shape, optimizer, loss) stops with the list; allow: resume anyway.
    resume_mismatch: str = "refuse"
    # refuse: a run_dir that is no sparrow run's but holds files under the names a run writes
    # (metrics.jsonl, run_config.json, checkpoints/, policy/, ...) stops at start-up naming them;
    # allow: train there anyway, overwriting them (sparrow/train/run/run_dir.py).
    run_dir_reuse: str = "refuse"
    # Print the plan and the memory plan per phase, stop before training: model and data loaded
    # when the model is on disk, else from its config alone (sparrow/models/model_config.py).
    dry_run: bool = False

    def __post_init__(self):
        if self.resume not in RESUME_MODES and not os.path.isdir(self.resume):
            raise ValueError(
                f"resume={self.resume!r}: expected auto, never or an existing checkpoint "
                "directory (e.g. runs/x/checkpoints/step_000010)"
            )
        if self.resume_mismatch not in ("refuse", "allow"):
            raise ValueError(f"resume_mismatch={self.resume_mismatch!r}: expected refuse or allow")
        if self.run_dir_reuse not in ("refuse", "allow"):
            raise ValueError(f"run_dir_reuse={self.run_dir_reuse!r}: expected refuse or allow")
        resolve_objective(self.controller.objective, self.rollout.speculative.enabled)
        if self.rollout.speculative.enabled and self.distill.enabled and not self.distill.gate:
            raise ValueError(
                "rollout.speculative.enabled=true with distill.gate=false: the engine's weights "
                "would be theta + phi merged, and the verify pass must be the dense policy "
                "theta's: set distill.gate=true (the adapter then drafts only)"
            )
        if self.actor.lora.rank and self.distill.enabled and not self.distill.gate:
            raise ValueError(
                "actor.lora.rank with distill.gate=false: the engine would hold theta + phi "
                "merged while the policy adapter is pushed unmerged over the base: set "
                "distill.gate=true (phi then adds at sparse steps, on top of the adapter)"
            )
        if self.actor.lora.rank and self.rollout.engine.sleep == "weights":
            raise ValueError(
                "rollout.engine.sleep=weights with actor.lora.rank: a LoRA sync pushes the "
                "adapter alone, never the base again, so the engine keeps its base weights; "
                "use rollout.engine.sleep=kv"
            )
        if self.env.function and self.rollout.speculative.enabled:
            raise ValueError(
                "env.function with rollout.speculative.enabled: multi-turn episodes do not run "
                "speculatively yet; set rollout.speculative.enabled=false"
            )
        eng = self.rollout.engine
        in_process = self.rl.async_rollout.staleness and not self.cluster.rollout_ranks
        if eng.sleep != "off" and in_process:
            raise ValueError(
                f"rollout.engine.sleep={eng.sleep} with rl.async.staleness=1: the engine draws "
                "the next rollout beside the update, so it cannot sleep through it; set "
                "rollout.engine.sleep=off, or draw on rollout ranks (cluster.rollout_ranks)"
            )
        if eng.num_pages < 1 or eng.page_size < 1:
            raise ValueError(
                f"rollout.engine.num_pages and page_size must be >= 1, got {eng.num_pages} "
                f"and {eng.page_size}"
            )
        completion = max(self.rollout.max_new_tokens, self.rl.eval.max_new_tokens)
        if eng.num_pages * eng.page_size <= completion:
            raise ValueError(
                f"rollout.engine.num_pages={eng.num_pages} holds {eng.num_pages * eng.page_size} "
                f"tokens, no room for a prompt plus a {completion}-token completion: raise "
                "rollout.engine.num_pages"
            )
