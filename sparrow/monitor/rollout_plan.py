"""Which sequences of a step's rollout are decoded densely (the noise-floor share) and which keep
their logits for the exact acceptance: decided before `generate`, read again by the monitor.

Sequences are prompt-major, `group_size` per prompt; the noise-floor prompts are the last
`num_floor` of this rank's share.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from sparrow.monitor.config import MonitorConfig


@dataclass
class RolloutPlan:
    num_floor: int  # prompts rolled out densely for the dense-vs-dense noise floor
    floor_rows: Tensor  # (B,) bool, the sequences of those prompts
    schedules: list | None  # per sequence: the sparse schedule or None (dense); None: all sparse
    logit_rows: list[bool] | None  # sequences that keep their logits (exact acceptance); None: off


def exact_rows(floor_rows: Tensor, exact_fraction: float) -> Tensor:
    """(B,) bool, the rows the exact acceptance measures: every k-th sequence (all groups alike;
    k = round(1 / exact_fraction)) and every noise-floor one."""
    stride = max(1, round(1 / exact_fraction))
    return (torch.arange(len(floor_rows)) % stride == 0) | floor_rows


def plan_rollout(
    cfg: MonitorConfig, num_prompts: int, group_size: int, sparse, engine_is_dense_policy: bool
) -> RolloutPlan:
    """The plan for `num_prompts` prompts under the sparse schedule `sparse` (None: dense mode).

    The noise floor needs the engine's dense decode to be the dense policy (not so when a
    DistillSparse adapter is merged into the engine's weights); it takes at least one prompt
    when its fraction is positive, and never all of them.
    """
    num_floor = 0
    if cfg.noise_floor_fraction > 0 and engine_is_dense_policy and sparse is not None:
        num_floor = min(num_prompts - 1, max(1, round(cfg.noise_floor_fraction * num_prompts)))
    floor = torch.tensor(
        [i >= num_prompts - num_floor for i in range(num_prompts) for _ in range(group_size)]
    )  # (B,)
    schedules = None
    if num_floor:
        schedules = [None if f else sparse for f in floor.tolist()]
    logit_rows = exact_rows(floor, cfg.exact_fraction).tolist() if cfg.exact else None
    return RolloutPlan(num_floor, floor, schedules, logit_rows)
