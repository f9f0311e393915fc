"""Rollout ranks apart from training ranks: a torchrun world split into two roles.

The last R ranks of the world roll out (the engine only: no actor, no optimizer state) and the
others train. Each role gets its own default process group, joined through torchrun's store under
its own prefix, so everything that already works on "all ranks" (DeepSpeed's ZeRO, the step's
sums in sparrow.distributed, checkpoints) sees only its role's ranks; RANK and WORLD_SIZE are
rewritten to the role's own (the world's kept as SPARROW_WORLD_RANK and SPARROW_WORLD_SIZE), and
SPARROW_LOCAL_TRAINERS counts the training ranks on this host (they share its RAM). Two
standalone groups join the roles, each a `Link`:

    bridge  every rank of the world, always over gloo: requests, and the step's rows from
            rollout ranks to trainers (small; a dead peer closes its TCP connection and is seen
            at once, where NCCL would wait out its timeout)
    push    training rank 0 and the rollout ranks: the weight push (rollout/weight_push.py),
            over NCCL when every rank has a GPU of its own (cluster.push_backend=auto), else gloo

Objects cross a Link with torch.save; a CUDA tensor lands on the receiver's own device (the
sender's GPU index means nothing in another process), a CPU tensor stays on the CPU: the
receiver holds them where one process holding both sides would. A collective of a Link that
fails because a peer died or stopped answering raises PeerLost (sparrow.distributed), which the
CLI turns into its one-line lost-rank stop.
"""

import io
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from sparrow.distributed import PeerLost, peer_lost_words

PUSH_BACKENDS = ("auto", "nccl", "gloo")


class Link:
    """Collectives over a standalone process group (none of torch's registered groups):
    broadcasts of tensors and picklable objects, an all-gather of objects. `rank`: this process's
    place in the group, `size` its ranks, `device` where its backend moves tensors, `land` where
    a received object's CUDA tensors go (this rank's compute device; default `device`)."""

    def __init__(
        self, pg: Any, rank: int, size: int, device: torch.device, land: torch.device | None = None
    ):
        self.pg, self.rank, self.size, self.device = pg, rank, size, device
        self.land = device if land is None else land

    def broadcast(self, tensor: Tensor, root: int) -> None:
        """`tensor` from the group's rank `root` into every rank's `tensor`, in place."""
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        self._wait(lambda: self.pg.broadcast([tensor], opts))

    def broadcast_object(self, obj, root: int):
        """`root`'s picklable `obj` on every rank (the others pass anything)."""
        size = torch.zeros(1, dtype=torch.int64, device=self.device)
        data = dumps(obj) if self.rank == root else b""
        size[0] = len(data)
        self.broadcast(size, root)
        payload = torch.empty(int(size), dtype=torch.uint8, device=self.device)
        if self.rank == root:
            payload.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        self.broadcast(payload, root)
        return obj if self.rank == root else loads(payload.cpu().numpy().tobytes(), self.land)

    def gather_objects(self, obj) -> list:
        """Every rank's picklable `obj`, in the group's rank order, on every rank."""
        data = dumps(obj)
        sizes = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.size)]
        mine = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        self._wait(lambda: self.pg.allgather([sizes], [mine]))
        width = int(max(int(s) for s in sizes))
        padded = torch.zeros(width, dtype=torch.uint8, device=self.device)
        padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        parts = [torch.empty(width, dtype=torch.uint8, device=self.device) for _ in sizes]
        self._wait(lambda: self.pg.allgather([parts], [padded]))
        return [
            loads(p[: int(s)].cpu().numpy().tobytes(), self.land)
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


def dumps(obj: Any) -> bytes:
    """`obj` (anything picklable, tensors on any device among it) as bytes for a Link."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def loads(data: bytes, land: torch.device) -> Any:
    """`dumps`'s object back, its tensors placed by `landing(land)`. Only a peer of the same run
    sends these bytes: unpickled in full, as torch.distributed's own object collectives do."""
    return torch.load(io.BytesIO(data), map_location=landing(land), weights_only=False)


def landing(land: torch.device):
    """torch.load's map_location for a receiver computing on `land`: a storage saved on any GPU
    goes to `land` when that is a GPU (else stays on the CPU), one saved on the CPU stays."""

    def place(storage, location: str):
        if location.startswith("cuda") and land.type == "cuda":
            return storage.cuda(land.index)
        return storage  # torch.load hands every storage over on the CPU first

    return place


def local_device() -> torch.device:
    """This rank's compute device: the host's GPUs dealt round robin over its torchrun ranks
    (LOCAL_RANK), so that a host with fewer GPUs than ranks shares them; the CPU without CUDA."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())


def gpu_identity() -> str | None:
    """This rank's GPU as its host and device UUID (two ranks that see the same GPU under
    different indices, or one each under CUDA_VISIBLE_DEVICES, tell apart); None without CUDA."""
    if not torch.cuda.is_available():
        return None
    return f"{socket.gethostname()}/{torch.cuda.get_device_properties(local_device()).uuid}"


@dataclass
class Roles:
    """This process's role in a world split by `split_world`."""

    role: str  # "train" | "rollout"
    world_rank: int  # in the whole world
    world_size: int
    rollout_ranks: int  # R: the world's last R ranks roll out
    push: Link | None  # training rank 0 (its rank 0), then the rollout ranks; None elsewhere
    bridge: Link  # every rank of the world, over gloo
    push_backend: str = "gloo"  # the push group's: "nccl" | "gloo", the same on every rank


def split_world(
    rollout_ranks: int, backend: str, timeout: timedelta, push_backend: str = "auto"
) -> Roles:
    """Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set), join this rank's role's
    default process group and the two links. `backend`: the training ranks' ("gloo" or "nccl";
    the rollout ranks' own group, which nothing of theirs reduces over, is gloo); `push_backend`:
    one of PUSH_BACKENDS, "auto" being NCCL when every rank of the world has a GPU of its own."""
    world_rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not 1 <= rollout_ranks < world:
        raise ValueError(
            f"cluster.rollout_ranks={rollout_ranks}: between 1 and {world - 1} of {world} ranks"
        )
    if push_backend not in PUSH_BACKENDS:
        raise ValueError(f"cluster.push_backend={push_backend!r}: one of {PUSH_BACKENDS}")
    trainers = world - rollout_ranks
    role = "train" if world_rank < trainers else "rollout"
    role_rank = world_rank if role == "train" else world_rank - trainers
    role_size = trainers if role == "train" else rollout_ranks
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    device = local_device()
    if device.type == "cuda":  # NCCL's communicators bind the current device when first used
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend if role == "train" else "gloo",
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
    bridge_pg = _group("gloo", store, "bridge", world_rank, world, timeout)
    bridge = Link(bridge_pg, world_rank, world, torch.device("cpu"), land=device)
    push_backend = _push_backend(push_backend, bridge)
    push = None
    if role == "rollout" or role_rank == 0:
        rank = 0 if role == "train" else 1 + role_rank
        pg = _group(push_backend, store, "push", rank, rollout_ranks + 1, timeout)
        link_device = device if push_backend == "nccl" else torch.device("cpu")
        push = Link(pg, rank, rollout_ranks + 1, link_device, land=device)
    return Roles(role, world_rank, world, rollout_ranks, push, bridge, push_backend)


def _push_backend(asked: str, bridge: Link) -> str:
    """The push group's backend, agreed over the bridge (a group's ranks must all build the same
    one): every rank tells its GPU, and NCCL needs one to each rank, none shared."""
    gpus = bridge.gather_objects(gpu_identity())
    shared = [r for r, gpu in enumerate(gpus) if gpu is None or gpus.count(gpu) > 1]
    if asked == "auto":
        return "gloo" if shared else "nccl"
    if asked == "nccl" and shared:
        raise ValueError(
            f"cluster.push_backend=nccl needs a GPU to each rank; world ranks {shared} have none "
            "of their own (NCCL refuses two ranks on one GPU): use cluster.push_backend=gloo"
        )
    return asked


def _group(
    backend: str, store: dist.Store, name: str, rank: int, size: int, timeout: timedelta
) -> Any:  # ProcessGroupGloo | ProcessGroupNCCL, called directly
    prefixed = dist.PrefixStore(f"sparrow/{name}", store)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, options)
    return dist.ProcessGroupGloo(prefixed, rank, size, timeout)
