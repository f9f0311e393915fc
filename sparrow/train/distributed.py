"""Every reduction of a step's numbers over data-parallel ranks, in one place: sums, means,
extremes, and the pooling of per-token values before percentiles. With one rank each is the
identity, and none of them needs DeepSpeed (plain torch.distributed)."""

import torch
import torch.distributed as dist
from torch import Tensor


class Ranks:
    """This process's place among `world` data-parallel ranks, and the reductions over them."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def sum(self, value) -> float:
        t = torch.as_tensor(value, dtype=torch.float64).reshape(1).clone()
        if self.world > 1:
            dist.all_reduce(t)
        return float(t)

    def mean(self, total, count) -> float:
        """sum(total) / sum(count) over ranks (the mean over all ranks' items)."""
        return self.sum(total) / max(self.sum(count), 1.0)

    def extreme(self, values: list[float], how: str) -> float:
        """The min or max (`how`) of `values` over all ranks."""
        t = torch.tensor([min(values) if how == "min" else max(values)], dtype=torch.float64)
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MIN if how == "min" else dist.ReduceOp.MAX)
        return float(t)

    def gather_tokens(self, values: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """All ranks' (N,) per-token values and their (N,) positions, concatenated."""
        if self.world == 1:
            return values, positions
        parts = [None] * self.world
        dist.all_gather_object(parts, (values.cpu(), positions.cpu()))
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
