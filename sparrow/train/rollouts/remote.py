"""The rollout producer on rollout ranks apart from the trainers (sparrow/cluster.py's roles): the
training side's `RemoteRollouts` answers pipeline.RolloutPipeline's calls, and each
rollout rank runs `serve_rollouts`, which draws and loads pushed weights in the order the trainers
ask, one request at a time.

Every exchange is a request that training rank 0 broadcasts over the bridge (all ranks of the
world receive it, the other trainers too, so that every rank calls the same collectives):

    ("draw", step)            start drawing `step` on the engine's current weights, with each
                              trainer's payload (what its draw needs; picklable, opaque here),
                              gathered over the bridge right after
    ("push", version, adapter) load the weights training rank 0 now pushes (rollout/weight_push.py):
                              theta, or with `adapter` (LoRA RL) the policy's adapter alone
    ("rows", step)            hand over `step`'s DrawnStep (bridge gather)
    ("wait",)                 answer (bridge gather) once the draw in flight is done
    ("stop",)                 the trainers are done

A rollout rank handles a request only after the previous one is done, so its engine never
changes under a draw (the in-process pipeline's `wait()` before a weight change), and a draw
requested before an update runs while the trainers update: step t+1's rollout during update t.
Rollout rank r serves the training ranks i with i % R == r (R rollout ranks; fewer rollout than
training ranks is the point of sparse rollouts), drawing their shares one after the other.
"""

import time
from collections.abc import Callable
from typing import Any

import torch

from sparrow.cluster import Roles
from sparrow.rollout.weight_push import PushStats, WeightPush
from sparrow.train.rollouts.drawn import DrawnStep, PendingStep

# draw(step, payload, version) -> DrawnStep: the rollout rank's work for one step.
Draw = Callable[[int, Any, int], DrawnStep]


class RemoteRollouts:
    """RolloutPipeline's interface on a training rank, served by the rollout ranks."""

    def __init__(
        self,
        roles: Roles,
        payload: Callable[[int], Any],
        bucket_bytes: int,
        dtype: torch.dtype,
        adapter: bool = False,
    ):
        """payload(step): what the rollout ranks' draw of `step` needs (asked at submit time);
        bucket_bytes, dtype: the weight push's bucket and the engine's dtype; adapter: pushes
        carry the policy's LoRA adapter, not theta (actor.lora)."""
        if roles.role != "train":
            raise ValueError("RemoteRollouts runs on training ranks; rollout ranks serve")
        self.roles, self._payload = roles, payload
        self.push_link = roles.push  # training rank 0 only
        self.bucket_bytes, self.dtype, self.adapter = bucket_bytes, dtype, adapter
        self._slot = PendingStep()  # its rows in hand only once fetched (a checkpoint's)

    @property
    def pending(self) -> int | None:
        return self._slot.step

    def submit(self, step: int) -> None:
        """The rollout ranks start drawing `step` (they are busy until it is done)."""
        self._slot.start(step)
        self._request(("draw", step))
        self.roles.bridge.gather_objects(self._payload(step))

    def wait(self) -> float:
        """Block until the rollout ranks' draw in flight (if any) is done; the seconds waited."""
        start = time.perf_counter()
        self._request(("wait",))
        self.roles.bridge.gather_objects(None)
        return time.perf_counter() - start

    def result(self, step: int) -> DrawnStep:
        """`step`'s rollout from this rank's paired rollout rank (drawn now if not submitted)."""
        if self._slot.step is None:
            self.submit(step)
        self._slot.check(step)
        if self._slot.done is None:
            self._slot.done = self._rows(step)
        return self._slot.take()

    def _rows(self, step: int) -> DrawnStep:
        self._request(("rows", step))
        served = self.roles.bridge.gather_objects(None)
        rank, trainers = self.roles.world_rank, _trainers(self.roles)
        return served[trainers + rank % self.roles.rollout_ranks][rank]

    def push(self, buckets, version: int) -> dict[str, float]:
        """The weights of `version` (every training rank draws `buckets`: a collective under
        ZeRO-3; training rank 0 sends them) into the rollout ranks' engines; the push metrics."""
        self._request(("push", version, self.adapter))
        if self.push_link is not None:
            stats = WeightPush(self.push_link, 0, self.bucket_bytes, self.dtype).send(buckets)
        else:
            start = time.perf_counter()
            for _ in buckets:
                pass
            stats = PushStats(time.perf_counter() - start, 0, 0)
        return {"sync/push_s": stats.seconds, "sync/push_bytes": float(stats.bytes)}

    def close(self) -> None:
        """Let the rollout ranks go (the trainers' loop is over)."""
        self._request(("stop",))

    def state_dict(self) -> dict | None:
        """The pending draw's rows (fetched now, waiting for a draw in flight), or None: what a
        resumed run trains next, as the one-process pipeline keeps them (their prompts and
        sampling seed are spent, and their weights are gone once the update moved them). A
        collective of every rank of the world: one training rank only (the trainer refuses
        staleness with more)."""
        if self._slot.step is not None and self._slot.done is None:
            self._slot.done = self._rows(self._slot.step)
        return self._slot.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        self._slot.load_state_dict(state)

    def _request(self, request: tuple) -> None:
        self.roles.bridge.broadcast_object(request, 0)


def serve_rollouts(roles: Roles, engine, draw: Draw, bucket_bytes: int) -> int:
    """A rollout rank's loop: requests from training rank 0 until "stop"; returns how many
    steps it drew. `engine`: this rank's LLMEngine, loaded by the pushes."""
    assert roles.role == "rollout" and roles.push is not None
    dtype = engine.runner.model.dtype
    trainers = _trainers(roles)
    mine = [i for i in range(trainers) if i % roles.rollout_ranks == roles.world_rank - trainers]
    version, drawn, steps = 0, None, 0
    while True:
        request = roles.bridge.broadcast_object(None, 0)
        kind = request[0]
        if kind == "draw":
            payloads = roles.bridge.gather_objects(None)
            drawn = {i: draw(request[1], payloads[i], version) for i in mine}
            steps += 1
        elif kind == "push":
            WeightPush(roles.push, 0, bucket_bytes, dtype).receive(engine, adapter=request[2])
            version = request[1]
        elif kind == "rows":
            assert drawn is not None, "rows before their draw"
            assert all(d.step == request[1] for d in drawn.values()), "rows of another step"
            roles.bridge.gather_objects(drawn)
            drawn = None
        elif kind == "wait":
            roles.bridge.gather_objects(None)
        elif kind == "stop":
            return steps
        else:
            raise ValueError(f"unknown request {kind!r}")


def _trainers(roles: Roles) -> int:
    return roles.world_size - roles.rollout_ranks
