"""Worker for tests/train/rollouts/test_remote_rollouts.py, under torchrun with 2 to 4 ranks (gloo,
CPU): `--rollout-ranks` ranks serve rollouts (sparrow/train/rollouts/remote.py), the others train (a
stand-in loop with RolloutPipeline's calls, as the asynchronous trainer makes them).

The trainers' "update" adds 1 to every weight of a tiny model, so the engine weights of version v
are the initial ones + v; it does not finish before the rollout rank has started drawing the
next step (it waits for its own draw's marker file), which would hang if the draw did not
overlap it.
A rollout rank's stand-in draw records its step, the payload it was asked with, the weight
version it holds and its engine's first embedding value. With `--die-in-draw S` the rollout
ranks exit without a word while drawing step S; each trainer records what its next call raised.
Training ranks save `--out/train{rank}.pt`, with the share of a 12 GiB host their memory plan
would take (rank_device_memory, after split_world counted this host's training ranks).
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for tiny_lm
from hang_guard import CHILD_GUARD_S, COLLECTIVE_GUARD  # noqa: E402
from tiny_lm import tiny_causal_lm  # noqa: E402

from sparrow.cluster import split_world  # noqa: E402
from sparrow.distributed import lost_peer  # noqa: E402
from sparrow.rl.actor import parameter_buckets  # noqa: E402
from sparrow.rollout.engine import EngineConfig, LLMEngine  # noqa: E402
from sparrow.train.config import MemoryConfig  # noqa: E402
from sparrow.train.memory.fit import rank_device_memory  # noqa: E402
from sparrow.train.rollouts.drawn import DrawnStep  # noqa: E402
from sparrow.train.rollouts.remote import RemoteRollouts, serve_rollouts  # noqa: E402

BUCKET = 40_000  # bytes: several buckets, the embedding in pieces


def marker(out: Path, step: int, rank: int) -> Path:
    return out / f"draw_started_{step}_rank{rank}"


def rollout_rank(args, roles) -> None:
    model = tiny_causal_lm("llama", seed=0)
    engine = LLMEngine(model, None, EngineConfig(page_size=4, num_pages=16))
    role_rank = roles.world_rank - (roles.world_size - roles.rollout_ranks)

    def draw(step, payload, version) -> DrawnStep:
        marker(args.out, step, payload["rank"]).touch()
        if step == args.die_in_draw:
            os._exit(0)  # as a SIGKILL would: no goodbye on any link
        embed = float(engine.runner.model.embed[0, 0])
        seen = {"payload": payload, "embed": embed, "rank": role_rank}
        return DrawnStep(step, seen, version, None, {})  # type: ignore[arg-type]

    serve_rollouts(roles, engine, draw, BUCKET)


def trainer(args, roles) -> None:
    model = tiny_causal_lm("llama", seed=0)
    initial = float(model.model.embed_tokens.weight[0, 0])
    rank = roles.world_rank
    remote = RemoteRollouts(
        roles, lambda step: {"asked": step, "rank": rank}, BUCKET, torch.float32
    )
    # What the trainer's memory plan would size against on this host: a 12 GiB host shared by
    # the training ranks that split_world counted on it (SPARROW_LOCAL_TRAINERS).
    share = rank_device_memory(MemoryConfig(device_gib=12.0), on_gpu=False).bytes
    record = {"initial": initial, "steps": [], "push": [], "raised": None, "ram_share": share}
    try:
        for step in range(args.steps):
            drawn = remote.result(step)  # step 0: drawn now; later: submitted a step ago
            record["steps"].append((drawn.step, drawn.version, drawn.sampled))
            if step + 1 < args.steps:
                remote.submit(step + 1)
            update(model, args.out, step + 1, roles.world_rank, args.steps)
            remote.wait()
            record["push"].append(
                remote.push(parameter_buckets(model, BUCKET, torch.float32), step + 1)
            )
        remote.close()
    except Exception as err:
        record["raised"] = (repr(err)[:300], lost_peer(err))
    torch.save(record, args.out / f"train{roles.world_rank}.pt")


def update(model, out: Path, next_step: int, rank: int, steps: int) -> None:
    """+1 on every weight, finished only once the next step's draw has started."""
    if next_step < steps:
        deadline = time.monotonic() + CHILD_GUARD_S  # the draw starts in ms when healthy
        while not marker(out, next_step, rank).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"step {next_step}'s draw never started during the update")
            time.sleep(0.01)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--die-in-draw", type=int, default=-1)
    parser.add_argument("--rollout-ranks", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    # A hang guard: a 60 s one can trip on ranks still starting under load (issue 61).
    roles = split_world(args.rollout_ranks, "gloo", COLLECTIVE_GUARD)
    (trainer if roles.role == "train" else rollout_rank)(args, roles)


if __name__ == "__main__":
    main()
