"""The dense actor's settings (the `actor` config group) and its LR schedule, apart from the actor
itself so that reading a config imports neither DeepSpeed nor the actor (benchmarks, the rollout
engine, the trainer run with a plain-torch actor)."""

import math
from dataclasses import dataclass


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

    def __post_init__(self):
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0-3, got {self.zero_stage}")
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be auto, bf16 or fp32, got {self.precision!r}")
        if self.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"lr_schedule must be constant or cosine, got {self.lr_schedule!r}")
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
