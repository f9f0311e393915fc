"""The policy's weights from a training rank to the rollout ranks, in buckets, over
torch.distributed (gloo on CPU, NCCL on GPU).

A push is a sequence of messages broadcast from one sender (`src`) over a link that holds it and
the rollout ranks (sparrow.cluster.Link, or anything with its two broadcasts): each message is a
small pickled header (what the flat buffer holds: name, full shape, start and length of the
piece) and then one flat buffer of at most `bucket_bytes` in the engine's dtype; a header None
ends the push. A tensor larger than a bucket travels in several pieces, which the receiver stages
until the tensor is whole. The receiver loads each message's whole tensors into its engine as
they arrive (repacking the linear backend once at the end), so neither side ever holds more than
a bucket in flight besides the engine's own weights and one staged tensor. The buckets come from
the caller (the actor yields its parameters one gathered bucket at a time,
sparrow.rl.actor.DenseActor.weight_buckets); `plan_buckets` is the grouping both use.
"""

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

# One piece of a message: HF name, the tensor's full shape, start and length in its flat view.
Piece = tuple[str, tuple[int, ...], int, int]


class Link(Protocol):
    """What a push needs of its group (sparrow.cluster.Link has it)."""

    device: torch.device  # where the group's backend moves tensors

    def broadcast(self, tensor: Tensor, root: int) -> None: ...

    def broadcast_object(self, obj: Any, root: int) -> Any: ...


@dataclass
class PushStats:
    """What one push moved: for the step's metrics (sync/push_s, sync/push_bytes)."""

    seconds: float  # wall time of the whole push on this rank
    bytes: int  # payload bytes (the flat buffers, in the engine's dtype)
    messages: int  # flat buffers broadcast (a bucket, or a piece of a tensor over a bucket)


def plan_buckets(nbytes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Consecutive indices of tensors of `nbytes` bytes grouped into buckets of at most
    `bucket_bytes` each; a tensor larger than a bucket is a bucket of its own."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[list[int]] = []
    filled = bucket_bytes  # the first tensor opens a bucket
    for i, size in enumerate(nbytes):
        if filled + size > bucket_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(i)
        filled += size
    return buckets


class WeightPush:
    """One sender -> every other rank of `group`: `send` on the sender, `receive` on the others,
    called once per weight version on every rank of the group."""

    def __init__(self, link: Link, src: int, bucket_bytes: int, dtype: torch.dtype):
        """link: the sender and the rollout ranks; src: the sender's rank in it; dtype: the
        engine's."""
        if bucket_bytes < dtype.itemsize:
            raise ValueError(f"a bucket of {bucket_bytes} bytes holds no {dtype} element")
        self.link, self.src, self.dtype, self.device = link, src, dtype, link.device
        self.bucket_bytes = bucket_bytes
        self.cap = bucket_bytes // dtype.itemsize  # elements per message

    def send(self, buckets: Iterable[list[tuple[str, Tensor]]]) -> PushStats:
        """Broadcast every (name, tensor) of `buckets`; a bucket's tensors are read only before
        the next bucket is drawn (under ZeRO-3 they are gathered just for it)."""
        start, sent, messages = time.perf_counter(), 0, 0
        for bucket in buckets:
            for pieces, sources in self._messages(bucket):
                flat = torch.empty(sum(p[3] for p in pieces), dtype=self.dtype, device=self.device)
                at = 0
                for (_, _, first, n), tensor in zip(pieces, sources, strict=True):
                    flat[at : at + n].copy_(tensor.detach().reshape(-1)[first : first + n])
                    at += n
                self._header(pieces)
                self.link.broadcast(flat, self.src)
                sent, messages = sent + flat.numel() * self.dtype.itemsize, messages + 1
        self._header(None)
        return PushStats(time.perf_counter() - start, sent, messages)

    def receive(self, engine, adapter: bool = False) -> PushStats:
        """Load what the sender pushes into `engine` (sparrow.rollout.engine.LLMEngine): HF-named
        weights, or with `adapter` the policy's LoRA factors (LoRA RL: the adapter alone
        travels, as sparrow.rollout.lora.wire_tensors names them)."""
        stats = PushStats(0.0, 0, 0)
        start = time.perf_counter()
        if adapter:
            engine.update_policy_lora_in_buckets(self._received(stats))
        else:
            engine.update_weights_in_buckets(self._received(stats))
        stats.seconds = time.perf_counter() - start
        return stats

    def _received(self, stats: PushStats) -> Iterator[dict[str, Tensor]]:
        """Each message's whole tensors as a state dict, pieces staged until whole."""
        staged: dict[str, Tensor] = {}  # name -> (numel,) flat, filled piece by piece
        while (pieces := self._header()) is not None:
            flat = torch.empty(sum(p[3] for p in pieces), dtype=self.dtype, device=self.device)
            self.link.broadcast(flat, self.src)
            stats.bytes += flat.numel() * self.dtype.itemsize
            stats.messages += 1
            whole = self._unpack(pieces, flat, staged)
            if whole:
                yield whole
        if staged:
            raise RuntimeError(f"weight push ended with {sorted(staged)} incomplete")

    def _unpack(
        self, pieces: list[Piece], flat: Tensor, staged: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """The tensors `flat` completes: its whole ones as views, a piece into `staged`."""
        whole, at = {}, 0
        for name, shape, first, n in pieces:
            numel = math.prod(shape)
            if n == numel:
                whole[name] = flat[at : at + n].view(shape)
            else:
                if first == 0:
                    staged[name] = torch.empty(numel, dtype=self.dtype, device=self.device)
                staged[name][first : first + n] = flat[at : at + n]
                if first + n == numel:
                    whole[name] = staged.pop(name).view(shape)
            at += n
        return whole

    def _messages(
        self, bucket: list[tuple[str, Tensor]]
    ) -> Iterator[tuple[list[Piece], list[Tensor]]]:
        """`bucket` cut into messages of at most `cap` elements: whole tensors together, a larger
        tensor in pieces of its own."""
        pieces: list[Piece] = []
        sources: list[Tensor] = []
        for name, tensor in bucket:
            numel, shape = tensor.numel(), tuple(tensor.shape)
            if pieces and sum(p[3] for p in pieces) + numel > self.cap:
                yield pieces, sources
                pieces, sources = [], []
            for first in range(0, max(numel, 1), self.cap):
                piece = (name, shape, first, min(self.cap, numel - first))
                if numel > self.cap:
                    yield [piece], [tensor]
                else:
                    pieces.append(piece)
                    sources.append(tensor)
        if pieces:
            yield pieces, sources

    def _header(self, pieces: list[Piece] | None = None) -> list[Piece] | None:
        """The next message's pieces from the sender (None: the push is over)."""
        return self.link.broadcast_object(pieces, self.src)
