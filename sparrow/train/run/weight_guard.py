"""Finite weights after every update, or a clear stop before anything is saved; and a stop after
too many updates in a row skipped for a non-finite loss or gradient.

The actor skips updates whose loss or gradient is NaN/Inf, but a finite gradient times a huge
learning rate (actor.lr=1e37) still leaves weights that are Inf, NaN or so large that the
next forward overflows. After each update the trainer sums the squared parameters in fp32 (one
pass over the weights, this rank's ZeRO-3 shard where partitioned): a non-finite sum means a
weight is non-finite or beyond ~1e19, and the run stops before that step is logged or
checkpointed, so every checkpoint on disk holds finite weights and the newest one is the last
good state to resume from.
"""

import logging
import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from sparrow.distributed import all_reduce_host

log = logging.getLogger(__name__)


class NonFiniteWeights(RuntimeError):
    """The parameters stopped being finite; str() names the step and the checkpoint to resume."""


class NonFiniteStreak(RuntimeError):
    """Too many consecutive updates skipped for NaN/Inf: stop instead of training on garbage."""


def next_nonfinite_streak(streak: int, update: dict, step: int, max_streak: int) -> int:
    """The streak after `step`'s update: one longer if the actor skipped it for a non-finite loss
    or gradient, else 0. Raises NonFiniteStreak when it reaches `max_streak`."""
    if update.get("skipped", 0.0) <= 0:
        return 0
    streak += 1
    log.warning("step %d: non-finite loss or gradient, update skipped", step)
    if streak >= max_streak:
        raise NonFiniteStreak(
            f"{streak} consecutive updates had a non-finite loss or gradient (last at step "
            f"{step}); stopping. Lower actor.lr or check the data; resume=auto restarts from the "
            "last checkpoint."
        )
    return streak


def squared_norm(model: nn.Module, world_size: int) -> float:
    """Sum of squared parameters in fp32 over all ranks (inf when it overflows)."""
    total = torch.zeros((), dtype=torch.float32)
    for p in model.parameters():
        local = getattr(p, "ds_tensor", p)  # ZeRO-3 keeps only this rank's shard in ds_tensor
        total += local.detach().float().pow(2).sum().cpu()
    if world_size > 1:
        total = all_reduce_host(total.reshape(1))
    return float(total)


def check_weights(
    model: nn.Module, world_size: int, step: int, last_good: Callable[[], Path | None]
) -> float:
    """The squared norm after step `step`'s update; raises NonFiniteWeights when not finite.

    `last_good` finds the newest complete checkpoint (called only on failure), for the message.
    """
    value = squared_norm(model, world_size)
    if math.isfinite(value):
        return value
    newest = last_good()
    where = (
        f"the last good checkpoint {newest} is kept"
        if newest is not None
        else "no checkpoint was written"
    )
    raise NonFiniteWeights(
        f"the weights are not finite after the update of step {step} (sum of squares {value}); "
        f"nothing of this step was saved and {where}. Lower actor.lr (or actor.grad_clip)"
        " and run again: resume=auto restarts from the last good checkpoint"
    )
