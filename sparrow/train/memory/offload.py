"""ZeRO-Offload's share of the memory plan (plan.py): what actor.offload_optimizer=cpu and
actor.offload_params=cpu (DeepSpeed's own offload, sparrow.rl.actor) move from the GPU into host
RAM, and the host RAM each rank has for it.

Per rank, DeepSpeed's offload keeps in host RAM the fp32 master partition (also of fp32 weights:
ZeRO's optimizer steps its own fp32 copy), AdamW's m and v, and the fp32 gradient partition the
reduced gradients are copied into: 16 bytes per trained value / world. The GPU then keeps, of the
gradients, only ZeRO-2/3's reduce buckets (DeepSpeed's reduce_bucket_size, 5e8 values at most;
ZeRO-1 keeps whole gradients until the step). Weight offload (ZeRO-3) moves the weight partition
to host RAM too; the GPU holds the layers gathered for a pass, at most DeepSpeed's
stage3_max_live_parameters (1e9 values). On CPU the device is host RAM: nothing moves, and the
optimizer state grows by the fp32 master and gradient partition the offload adds.
"""

import os
from dataclasses import dataclass

from sparrow.train.config import MemoryConfig, SparrowConfig

GiB = 2**30
REDUCE_BUCKET_VALUES = 500_000_000  # DeepSpeed's reduce_bucket_size default
MAX_LIVE_VALUES = 1_000_000_000  # DeepSpeed's stage3_max_live_parameters default
_HOST_STATE = 16  # bytes per trained value: fp32 master, m, v and gradient
# A GPU config planned without a GPU: a DGX H100/H200 node's 2 TiB of host RAM for 8 GPUs.
DGX_HOST_PER_GPU = 2 * 1024 * GiB // 8
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class OffloadMemory:
    weights: int  # the actor's weights on the device
    optimizer: int  # its optimizer state on the device
    gradients: int  # its gradients on the device during the step
    host: int = 0  # what the offload holds in host RAM (this rank's share)


def offload_memory(
    cfg: SparrowConfig,
    params: int,
    on_gpu: bool,
    bf16: bool,
    weights: int,
    optimizer: int,
    gradients: int,
) -> OffloadMemory:
    """The actor's (weights, optimizer, gradients) bytes on the device given the plan's ones
    without offload, and the host bytes the offload holds (`params`: the model's values)."""
    actor = cfg.actor
    if actor.offload_optimizer == "none" and actor.offload_params == "none":
        return OffloadMemory(weights, optimizer, gradients)
    trained = optimizer // (12 if bf16 else 8)  # this rank's partition of the trained values
    host = 0
    if actor.offload_optimizer == "cpu":
        host = trained * _HOST_STATE
        if not on_gpu:  # the host is the device: the state stays in the plan's phases
            return OffloadMemory(weights, host, gradients)
        optimizer = 0
        if actor.zero_stage >= 2:
            model_bytes = _DTYPE_BYTES[cfg.model.dtype]
            gradients = min(gradients, REDUCE_BUCKET_VALUES * model_bytes)
    if actor.offload_params == "cpu" and on_gpu:
        host += weights
        weights = min(params, MAX_LIVE_VALUES) * _DTYPE_BYTES[cfg.model.dtype]  # gathered
    return OffloadMemory(weights, optimizer, gradients, host)


def host_memory(cfg: MemoryConfig, on_gpu: bool) -> tuple[int, str]:
    """(bytes, where the figure comes from) of host RAM one rank may fill with offloaded state,
    headroom not taken off: memory.host_gib shared by the host's ranks (LOCAL_WORLD_SIZE, else
    WORLD_SIZE); else the RAM available beside a GPU; a DGX node's share per GPU when a GPU run
    is planned without a GPU; (0, "") on CPU, where the host is the device."""
    if not on_gpu:
        return 0, ""
    import torch

    env = os.environ
    local = int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1")))
    if cfg.host_gib is not None:
        return int(cfg.host_gib * GiB) // local, f"memory.host_gib / {local} ranks"
    if torch.cuda.is_available():
        return _mem_available() // local, f"host RAM available / {local} ranks"
    return DGX_HOST_PER_GPU, "a DGX's 2 TiB / 8 GPUs, no GPU here"


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0
