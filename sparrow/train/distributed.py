"""Every reduction of a step's numbers over data-parallel ranks, in one place: sums, means,
extremes, and the pooling of per-token values before percentiles. With one rank each is the
identity, and none of them needs DeepSpeed (plain torch.distributed).

The step's numbers live on the host; `all_reduce_host` moves them to the device the process
group's backend reduces on (NCCL reduces CUDA tensors only: a CPU tensor raises "No backend type
associated with device type cpu"), so the same code runs under gloo on CPU and NCCL on GPUs."""

import torch
import torch.distributed as dist
from torch import Tensor


def collective_device() -> torch.device:
    """Where a collective's tensors must be: this rank's CUDA device under NCCL, else the CPU."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_host(t: Tensor, op=dist.ReduceOp.SUM) -> Tensor:
    """`t` (a host tensor) reduced over all ranks, as a new host tensor, under any backend."""
    reduced = t.to(collective_device(), copy=True)
    dist.all_reduce(reduced, op=op)
    return reduced.cpu()


class Ranks:
    """This process's place among `world` data-parallel ranks, and the reductions over them."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def sum(self, value) -> float:
        t = torch.as_tensor(value, dtype=torch.float64).reshape(1)
        return float(all_reduce_host(t) if self.world > 1 else t)

    def mean(self, total, count) -> float:
        """sum(total) / sum(count) over ranks (the mean over all ranks' items)."""
        return self.sum(total) / max(self.sum(count), 1.0)

    def extreme(self, values: list[float], how: str) -> float:
        """The min or max (`how`) of `values` over all ranks."""
        t = torch.tensor([min(values) if how == "min" else max(values)], dtype=torch.float64)
        if self.world > 1:
            t = all_reduce_host(t, dist.ReduceOp.MIN if how == "min" else dist.ReduceOp.MAX)
        return float(t)

    def gather_tokens(self, values: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """All ranks' (N,) per-token values and their (N,) positions, concatenated."""
        if self.world == 1:
            return values, positions
        parts = [None] * self.world
        dist.all_gather_object(parts, (values.cpu(), positions.cpu()))
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
