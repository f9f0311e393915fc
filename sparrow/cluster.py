"""Rollout ranks apart from training ranks: a torchrun world split into two roles.

The last R ranks of the world roll out (the engine only: no actor, no optimizer state) and the
others train. Each role gets its own default process group, joined through torchrun's store under
its own prefix, so everything that already works on "all ranks" (DeepSpeed's ZeRO, the step's
sums in sparrow.distributed, checkpoints) sees only its role's ranks; RANK and WORLD_SIZE are
rewritten to the role's own (the world's kept as SPARROW_WORLD_RANK and SPARROW_WORLD_SIZE), and
SPARROW_LOCAL_TRAINERS counts the training ranks on this host (they share its RAM). Two
standalone groups join the roles, each a `Link`:

    push    training rank 0 and the rollout ranks: the weight push (rollout/weight_push.py)
    bridge  every rank of the world: the step's rows from rollout ranks to trainers

A collective of a Link that fails because a peer died or stopped answering raises PeerLost
(sparrow.distributed), which the CLI turns into its one-line lost-rank stop.
"""

import os
import pickle
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from sparrow.distributed import PeerLost, peer_lost_words


class Link:
    """Collectives over a standalone process group (none of torch's registered groups):
    broadcasts of tensors and picklable objects, an all-gather of objects. `rank`: this process's
    place in the group, `size` its ranks, `device` where its backend moves tensors."""

    def __init__(self, pg: Any, rank: int, size: int, device: torch.device):
        self.pg, self.rank, self.size, self.device = pg, rank, size, device

    def broadcast(self, tensor: Tensor, root: int) -> None:
        """`tensor` from the group's rank `root` into every rank's `tensor`, in place."""
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        self._wait(lambda: self.pg.broadcast([tensor], opts))

    def broadcast_object(self, obj, root: int):
        """`root`'s picklable `obj` on every rank (the others pass anything)."""
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        data = pickle.dumps(obj) if self.rank == root else b""
        size[0] = len(data)
        self.broadcast(size, root)
        payload = torch.empty(int(size), dtype=torch.uint8, device=self.device)
        if self.rank == root:
            payload.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        self.broadcast(payload, root)
        return obj if self.rank == root else pickle.loads(payload.cpu().numpy().tobytes())

    def gather_objects(self, obj) -> list:
        """Every rank's picklable `obj`, in the group's rank order, on every rank."""
        data = pickle.dumps(obj)
        sizes = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.size)]
        mine = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        self._wait(lambda: self.pg.allgather([sizes], [mine]))
        width = int(max(int(s) for s in sizes))
        padded = torch.zeros(width, dtype=torch.uint8, device=self.device)
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        parts = [torch.empty(width, dtype=torch.uint8, device=self.device) for _ in sizes]
        self._wait(lambda: self.pg.allgather([parts], [padded]))
        return [
            pickle.loads(p[: int(s)].cpu().numpy().tobytes())
            for p, s in zip(parts, sizes, strict=True)
        ]

    @staticmethod
    def _wait(start) -> None:
        try:
            start().wait()
        except RuntimeError as err:  # gloo and NCCL raise RuntimeError subclasses
            if peer_lost_words(err):
                raise PeerLost(str(err)) from err
            raise


@dataclass
class Roles:
    """This process's role in a world split by `split_world`."""

    role: str  # "train" | "rollout"
    world_rank: int  # in the whole world
    world_size: int
    rollout_ranks: int  # R: the world's last R ranks roll out
    push: Link | None  # training rank 0 (its rank 0), then the rollout ranks; None elsewhere
    bridge: Link  # every rank of the world


def split_world(rollout_ranks: int, backend: str, timeout: timedelta) -> Roles:
    """Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set), join this rank's role's
    default process group and the two links; `backend`: "gloo" or "nccl"."""
    world_rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not 1 <= rollout_ranks < world:
        raise ValueError(
            f"cluster.rollout_ranks={rollout_ranks}: between 1 and {world - 1} of {world} ranks"
        )
    trainers = world - rollout_ranks
    role = "train" if world_rank < trainers else "rollout"
    role_rank = world_rank if role == "train" else world_rank - trainers
    role_size = trainers if role == "train" else rollout_ranks
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"sparrow/{role}", store),
        rank=role_rank,
        world_size=role_size,
        timeout=timeout,
    )
    os.environ.update(SPARROW_WORLD_RANK=str(world_rank), SPARROW_WORLD_SIZE=str(world))
    # torchrun numbers a node's ranks contiguously: this host's training ranks share its RAM.
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    first = world_rank - int(os.environ.get("LOCAL_RANK", "0"))
    local_trainers = sum(r < trainers for r in range(first, first + local_size))
    os.environ["SPARROW_LOCAL_TRAINERS"] = str(local_trainers)
    os.environ.update(RANK=str(role_rank), WORLD_SIZE=str(role_size))
    device = _device(backend)
    bridge_pg = _group(backend, store, "bridge", world_rank, world, timeout)
    bridge = Link(bridge_pg, world_rank, world, device)
    push = None
    if role == "rollout" or role_rank == 0:
        rank = 0 if role == "train" else 1 + role_rank
        pg = _group(backend, store, "push", rank, rollout_ranks + 1, timeout)
        push = Link(pg, rank, rollout_ranks + 1, device)
    return Roles(role, world_rank, world, rollout_ranks, push, bridge)


def _group(
    backend: str, store: dist.Store, name: str, rank: int, size: int, timeout: timedelta
) -> Any:  # ProcessGroupGloo | ProcessGroupNCCL, called directly
    prefixed = dist.PrefixStore(f"sparrow/{name}", store)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, options)
    return dist.ProcessGroupGloo(prefixed, rank, size, timeout)


def _device(backend: str) -> torch.device:
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
