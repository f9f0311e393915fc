"""The dense actor's settings (the `actor` config group) and its LR schedule, apart from the actor
itself so that reading a config imports neither DeepSpeed nor the actor (benchmarks, the rollout
engine, the trainer run with a plain-torch actor)."""

import math
from dataclasses import dataclass, field

# The decoder linears the rollout engine can add a LoRA delta to (sparrow.rollout.lora).
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class PolicyLoraConfig:
    """LoRA RL of the policy (sparrow.rl.policy_adapter): a peft adapter trained on the frozen base;
    the weight sync pushes the adapter alone and the engine adds it at every forward."""

    rank: int = 0  # LoRA rank r of the policy adapter; 0: no adapter, every weight trains
    alpha: float = 16.0  # LoRA alpha: the adapter's update B A is scaled by alpha / rank
    # peft targets: all-linear (every decoder linear, not the LM head) or a comma-separated
    # subset of q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj (quoted on the command
    # line: actor.lora.target_modules='q_proj,v_proj')
    target_modules: str = "all-linear"
    # LoRA dropout on the adapter's input: only 0 runs (the actor scores in eval mode, so the
    # PPO ratio is 1 at a step's first update and the kept dense log-probs are the policy's)
    dropout: float = 0.0

    def __post_init__(self):
        if self.rank < 0:
            raise ValueError(f"actor.lora.rank must be >= 0 (0: off), got {self.rank}")
        if self.rank and self.alpha <= 0:
            raise ValueError(f"actor.lora.alpha must be > 0, got {self.alpha}")
        if self.dropout != 0:
            raise ValueError(
                f"actor.lora.dropout={self.dropout} is not supported: the actor scores in eval "
                "mode (the PPO ratio is 1 at a step's first update), so dropout would never act; "
                "use 0"
            )
        unknown = sorted(set(self.modules()) - set(LORA_MODULES))
        if self.target_modules != "all-linear" and (unknown or not self.modules()):
            raise ValueError(
                f"actor.lora.target_modules={self.target_modules!r}: the engine applies LoRA to "
                f"all-linear or a comma-separated subset of {','.join(LORA_MODULES)} "
                f"(not {','.join(unknown) or 'an empty list'})"
            )

    def modules(self) -> list[str] | str:
        """peft's target_modules: "all-linear" or the list of module names."""
        if self.target_modules == "all-linear":
            return "all-linear"
        return [m.strip() for m in self.target_modules.split(",") if m.strip()]


@dataclass
class ActorConfig:
    zero_stage: int = 2  # DeepSpeed ZeRO stage: 0 none, 1 optimizer, 2 +gradients, 3 +weights
    precision: str = "auto"  # auto (bf16 on GPU, fp32 on CPU) | bf16 | fp32
    lr: float = 1e-6  # peak AdamW learning rate
    weight_decay: float = 0.01  # decoupled weight decay, applied to matrices only (not norms)
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW (beta1, beta2)
    grad_clip: float = 1.0  # clip the global gradient 2-norm to this; 0 disables clipping
    micro_batch_size: int = 4  # sequences per forward; shared prompts: whole groups, >= 1 group
    # Decoder tokens per forward (padded layout, see sparrow.rl.micro_batches); > 0 replaces
    # micro_batch_size and splits a group whose rows do not fit: memory follows the budget.
    max_tokens_per_micro_batch: int = 0
    activation_checkpointing: bool = False  # keep layer inputs only, recompute layers in backward
    # ZeRO-Offload (DeepSpeed's): cpu keeps the fp32 master weights, AdamW moments and gradient
    # partition in host RAM and steps them with DeepSpeed's CPUAdam; needs zero_stage >= 1.
    offload_optimizer: str = "none"  # none | cpu
    offload_params: str = "none"  # none | cpu: ZeRO-3's weight partition in host RAM (zero_stage 3)
    warmup_steps: int = 0  # optimizer steps of linear LR warmup from 0
    lr_schedule: str = "constant"  # constant | cosine (decays to 0 at total_steps)
    total_steps: int = 1000  # optimizer steps of the whole run (cosine schedule length)
    logprob_chunk_tokens: int = 1024  # (sequences x positions) per lm_head chunk: bounds logits
    share_prompts: bool = True  # compute a GRPO group's prompt once per pass, not G times (exact)
    # With share_prompts: also compute the token prefix common to all groups of a micro-batch
    # (few-shot examples, system prompt) once per pass, not once per group (exact).
    share_prefix: bool = True
    # How long a rank waits in a collective for the others before the job fails. Ranks meet
    # only between rank-local rollouts, whose lengths differ: DeepSpeed's default (10 min) ends
    # long-context runs whose slowest rank rolls out 10 min longer. Also how long the others
    # wait for a rank that hangs (one that dies is seen at once: its connections close).
    collective_timeout_min: float = 60.0
    lora: PolicyLoraConfig = field(default_factory=PolicyLoraConfig)  # LoRA RL (rank 0: off)

    def __post_init__(self):
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0-3, got {self.zero_stage}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be auto, bf16 or fp32, got {self.precision!r}")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"lr_schedule must be constant or cosine, got {self.lr_schedule!r}")
        for key in ("offload_optimizer", "offload_params"):
            if getattr(self, key) not in ("none", "cpu"):
                raise ValueError(f"actor.{key} must be none or cpu, got {getattr(self, key)!r}")
        if self.offload_optimizer == "cpu" and self.zero_stage == 0:
            raise ValueError(
                "actor.offload_optimizer=cpu needs actor.zero_stage >= 1 (ZeRO-Offload moves the "
                "partitioned optimizer state), got zero_stage=0"
            )
        if self.offload_params == "cpu" and self.zero_stage != 3:
            raise ValueError(
                "actor.offload_params=cpu needs actor.zero_stage=3 (only ZeRO-3 partitions the "
                f"weights it moves), got zero_stage={self.zero_stage}"
            )
        if self.lr < 0:
            raise ValueError(f"actor.lr must be >= 0, got {self.lr}")
        if self.micro_batch_size < 1:
            raise ValueError(f"actor.micro_batch_size must be >= 1: {self.micro_batch_size}")
        if self.collective_timeout_min <= 0:
            raise ValueError(
                f"actor.collective_timeout_min must be > 0, got {self.collective_timeout_min}"
            )
        if self.max_tokens_per_micro_batch < 0:
            raise ValueError(
                f"max_tokens_per_micro_batch must be >= 0, got {self.max_tokens_per_micro_batch}"
            )


def lr_multiplier(step: int, cfg: ActorConfig) -> float:
    """LR factor for optimizer step `step` (0-based): linear warmup, then constant or cosine."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return 1.0
    decay_steps = max(1, cfg.total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
    return 0.5 * (1.0 + math.cos(math.pi * progress))
