"""Every collective sparrow itself issues over data-parallel ranks, in one place: sums, means,
extremes and bounds of a step's numbers, the pooling of per-token values before percentiles and
of per-prompt scores, agreement checks, the adapter's gradient sum, barriers, and the decisions
rank 0 takes for all (which checkpoint to resume). With one rank each is the identity (no
collective is called), and none of them needs DeepSpeed: plain torch.distributed, importing no
other part of sparrow, so every package can reach it (DeepSpeed's own gradient reduction and
ZeRO gathers stay inside DeepSpeed).

The step's numbers live on the host; `all_reduce_host` moves them to the device the process
group's backend reduces on (NCCL reduces CUDA tensors only: a CPU tensor raises "No backend type
associated with device type cpu"), so the same code runs under gloo on CPU and NCCL on GPUs."""

import pickle
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

T = TypeVar("T")
# Rank r samples from seed + r * RANK_SEED_STRIDE + call index: streams meet only after 2^20
# generate calls, and 4096 ranks stay within the 32 bits the CPU generator keeps of a seed.
RANK_SEED_STRIDE = 1 << 20
# How gloo and NCCL word a collective whose peer died (closed or reset connection) or stopped
# answering (the process group's timeout, actor.collective_timeout_min), lower-cased.
_PEER_LOST = (
    "closed by peer",
    "reset by peer",
    "broken pipe",
    "timed out",
    "communicator was aborted",
    "watchdog caught collective operation timeout",
)


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


class PeerLost(RuntimeError):
    """A collective of a standalone group (sparrow.cluster.Link, called on the group itself, not
    through torch.distributed's functions) failed because another rank was lost."""


def peer_lost_words(err: BaseException) -> bool:
    """Whether `err`'s text is how gloo and NCCL word a lost connection or a timeout."""
    return any(words in str(err).lower() for words in _PEER_LOST)


def lost_peer(err: BaseException) -> bool:
    """Whether `err` is a collective that failed because another rank died or stopped answering:
    raised inside torch.distributed, in the words gloo and NCCL use for a lost connection or a
    timeout (a collective called wrongly, a bug, raises there too, in other words), or PeerLost."""
    if isinstance(err, PeerLost):
        return True
    if not isinstance(err, RuntimeError) or err.__traceback__ is None:
        return False
    *_, (frame, _) = traceback.walk_tb(err.__traceback__)  # the innermost frame
    inside = Path(frame.f_code.co_filename).parts[-3:-1] == ("torch", "distributed")
    return inside and peer_lost_words(err)


def rank_seed(seed: int, rank: int) -> int:
    """Rank `rank`'s sampling seed: `seed` itself on rank 0 (a 1-rank run is unchanged), another
    stream on every other rank, so that ranks do not draw the same random numbers."""
    return seed + rank * RANK_SEED_STRIDE


class Ranks:
    """This process's place among `world` data-parallel ranks, and the reductions over them."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    @classmethod
    def of_process_group(cls) -> "Ranks":
        """The default process group's ranks; one rank when there is none."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls(0, 1)

    def sum(self, value) -> float:
        t = torch.as_tensor(value, dtype=torch.float64).reshape(1)
        return float(all_reduce_host(t) if self.world > 1 else t)

    def sums(self, values: dict[str, float]) -> dict[str, float]:
        """Each value summed over ranks, in one all-reduce (every rank has the same keys)."""
        if self.world == 1 or not values:
            return dict(values)
        keys = sorted(values)
        packed = all_reduce_host(torch.tensor([values[k] for k in keys], dtype=torch.float64))
        return dict(zip(keys, packed.tolist(), strict=True))

    def mean(self, total, count) -> float:
        """sum(total) / sum(count) over ranks (the mean over all ranks' items)."""
        return self.sum(total) / max(self.sum(count), 1.0)

    def extreme(self, values: list[float], how: str) -> float:
        """The min or max (`how`) of `values` over all ranks."""
        t = torch.tensor([min(values) if how == "min" else max(values)], dtype=torch.float64)
        if self.world > 1:
            t = all_reduce_host(t, dist.ReduceOp.MIN if how == "min" else dist.ReduceOp.MAX)
        return float(t)

    def bounds(self, value: float) -> tuple[float, float]:
        """(min, max) of `value` over all ranks, in one all-reduce."""
        t = torch.tensor([value, -value], dtype=torch.float64)
        if self.world > 1:
            t = all_reduce_host(t, dist.ReduceOp.MAX)
        return -float(t[1]), float(t[0])

    def all_equal(self, value) -> bool:
        """Whether every rank holds the same (picklable) `value`."""
        if self.world == 1:
            return True
        everyone = [None] * self.world
        dist.all_gather_object(everyone, value)
        return all(other == value for other in everyone)

    def sum_gradients_(self, params: list[Tensor]) -> None:
        """Each parameter's gradient summed over ranks in place, on its device (a rank where a
        parameter got none joins with zeros, so that every rank calls the same collectives)."""
        if self.world == 1:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def gather(self, value) -> list:
        """Every rank's picklable `value`, in rank order (dynamic sampling's pooled groups)."""
        if self.world == 1:
            return [value]
        everyone = [None] * self.world
        dist.all_gather_object(everyone, value)
        return everyone

    def gather_tokens(self, values: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """All ranks' (N,) per-token values and their (N,) positions, concatenated."""
        if self.world == 1:
            return values, positions
        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, (values.cpu(), positions.cpu()))
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def gather_strided(self, values: list) -> list:
        """The whole list back, in its order, from every rank's share `whole[rank::world]`."""
        if self.world == 1:
            return list(values)
        parts: list[Any] = [None] * self.world
        dist.all_gather_object(parts, list(values))
        total = sum(len(p) for p in parts)
        return [parts[i % self.world][i // self.world] for i in range(total)]

    def from_rank0(self, decide: Callable[[], T]) -> T:
        """`decide()` run on rank 0 alone, its answer on every rank (collective: all ranks call).

        For choices read from a shared filesystem, which ranks on other nodes may see late (a
        cached directory listing): one answer for all, read once. An exception `decide` raises
        is raised on every rank, so that none is left waiting for the others.
        """
        if self.world == 1:
            return decide()
        box: list = [None]
        failure = None
        if self.rank == 0:
            try:
                box[0] = (decide(), None)
            except Exception as err:  # handed to the other ranks, then raised here too
                failure = err
                box[0] = (None, _portable(err))
        dist.broadcast_object_list(box, src=0, device=collective_device())
        value, error = box[0]
        if failure is not None:
            raise failure
        if error is not None:
            raise error
        return value


def _portable(err: Exception) -> Exception:
    """`err` itself when it pickles (to raise the same type on every rank), else its text."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:
        return RuntimeError(f"rank 0: {type(err).__name__}: {err}")
