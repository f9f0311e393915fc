"""Worker for tests/rl/test_weight_push.py, under torchrun with 2 ranks (gloo, CPU).

`--mode wire`: rank 0 pushes a tiny model's weights (seed 0) bucket by bucket
(sparrow.rl.actor.parameter_buckets -> WeightPush.send) to rank 1, whose engine was built from
another initialisation (seed 1), for each `--bucket-bytes` and both a tied (llama) and an untied
(qwen3) model. Rank 1 compares its engine, weight by weight and by its greedy logits, with an
engine built from the seed-0 model itself, and saves what it found to `--out/wire.pt`.

`--mode zero3`: both ranks hold the same tiny llama in a ZeRO-3 DenseActor (parameter
persistence threshold 0, so every parameter is partitioned) and draw `weight_buckets` for each
`--bucket-bytes`; at every bucket each rank sums the bytes of all parameters that are gathered
(full size) at that moment. Rank 0 saves those sums, the buckets' sizes and weights, and the
actor's own gathered_state_dict to `--out/zero3.pt`.
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for tiny_lm
from dist_worker import run_step  # noqa: E402
from hang_guard import COLLECTIVE_GUARD  # noqa: E402
from tiny_lm import random_prompts, tiny_causal_lm  # noqa: E402

from sparrow.cluster import split_world  # noqa: E402
from sparrow.distributed import lost_peer  # noqa: E402
from sparrow.rl.actor import DenseActor, parameter_buckets  # noqa: E402
from sparrow.rl.actor_config import ActorConfig  # noqa: E402
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from sparrow.rollout.weight_push import WeightPush  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, return_logits=True)
# A hang guard: a rollout rank waits here while its training ranks are still starting (a 60 s
# one tripped under load, issue 61); a dead peer is seen at once (closed connection).
TIMEOUT = COLLECTIVE_GUARD


class NoText:
    """The engine decodes each completion's text; these tests read only tokens and logits."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True) -> str:
        return ""


def engine_of(model, dtype: str) -> LLMEngine:
    # fp32 on the packed oneDNN GEMMs: logits from stale packed copies would show a missed repack.
    linear = "onednn" if dtype == "float32" else "torch"
    cfg = EngineConfig(page_size=4, num_pages=64, dtype=dtype, linear_backend=linear)
    return LLMEngine(model, NoText(), cfg)


def engine_weights(engine: LLMEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.runner.model._parameter_views().items()}


def greedy_logits(engine: LLMEngine) -> torch.Tensor:
    prompts = random_prompts(engine.runner.model.shape.vocab_size, [5, 9], seed=3)
    return torch.cat([o.logits for o in engine.generate(prompts, GREEDY)])


def wire(args) -> None:
    roles = split_world(1, "gloo", TIMEOUT)  # world rank 0 trains, world rank 1 rolls out
    assert roles.push is not None and dist.get_world_size() == 1
    rank, found = roles.push.rank, []
    for family in ("llama", "qwen3"):
        for dtype in ("float32", "bfloat16"):
            torch_dtype = getattr(torch, dtype)
            for bucket_bytes in args.bucket_bytes:
                push = WeightPush(roles.push, 0, bucket_bytes, torch_dtype)
                if rank == 0:
                    model = tiny_causal_lm(family, seed=0)
                    push.send(parameter_buckets(model, bucket_bytes, torch_dtype))
                    continue
                engine = engine_of(tiny_causal_lm(family, seed=1), dtype)
                before = engine_weights(engine)
                stats = push.receive(engine)
                reference = engine_of(tiny_causal_lm(family, seed=0), dtype)
                found.append(
                    {
                        "family": family,
                        "dtype": dtype,
                        "bucket_bytes": bucket_bytes,
                        "stats": stats,
                        "before": before,
                        "after": engine_weights(engine),
                        "want": engine_weights(reference),
                        "logits": greedy_logits(engine),
                        "want_logits": greedy_logits(reference),
                        "largest_tensor_bytes": max(
                            p.numel() * torch_dtype.itemsize
                            for p in tiny_causal_lm(family, seed=0).parameters()
                        ),
                        "unique_bytes": sum(
                            p.numel() * torch_dtype.itemsize
                            for p in tiny_causal_lm(family, seed=0).parameters()
                        ),
                    }
                )
    if rank == 1:
        torch.save(found, args.out / "wire.pt")


class FullyPartitioned(DenseActor):
    """ZeRO-3 with no parameter kept whole on every rank (the tiny model's are all small)."""

    def _deepspeed_config(self):
        config = super()._deepspeed_config()
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        return config


def gathered_bytes(model: torch.nn.Module) -> int:
    """Bytes of the partitioned parameters that are whole on this rank right now."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if hasattr(p, "ds_id"))


def zero3(args) -> None:
    roles = split_world(1, "gloo", TIMEOUT)  # world ranks 0, 1 train; 2 rolls out
    seen = roles.bridge.gather_objects((roles.role, dist.get_rank(), dist.get_world_size()))
    if roles.role == "rollout":
        return zero3_rollout(args, roles, seen)
    cfg = ActorConfig(zero_stage=3, lr=1e-3, micro_batch_size=2, precision="fp32")
    actor = FullyPartitioned(tiny_causal_lm("llama", seed=0), cfg)
    run_step(actor, 0, 8, 2)  # weights the rollout rank cannot know from the seed
    result = {"seen": seen, "actor_world": actor.world_size, "runs": []}
    result["idle_gathered"] = gathered_bytes(actor.model)
    for bucket_bytes in args.bucket_bytes:
        gathered, sizes, counts, weights = [], [], [], {}
        for bucket in actor.weight_buckets(bucket_bytes, torch.float32):
            gathered.append(gathered_bytes(actor.model))
            sizes.append(sum(t.numel() * t.element_size() for _, t in bucket))
            counts.append(len(bucket))
            weights |= {name: t.clone() for name, t in bucket}
        run = {"bucket_bytes": bucket_bytes, "gathered": gathered, "sizes": sizes}
        result["runs"].append(run | {"counts": counts, "weights": weights})
    result["full"] = {k: v.clone() for k, v in actor.gathered_state_dict().items()}
    result["largest_tensor_bytes"] = max(p.ds_numel * 4 for p in actor.model.parameters())
    if roles.push is not None:  # training rank 0: the sender
        for bucket_bytes in args.bucket_bytes:
            push = WeightPush(roles.push, 0, bucket_bytes, torch.float32)
            buckets = actor.weight_buckets(bucket_bytes, torch.float32)
            result.setdefault("pushed", []).append(push.send(buckets))
        roles.push.broadcast_object(result["full"], 0)
    else:  # training rank 1 draws the same buckets: ZeRO-3 gathers are collectives
        for bucket_bytes in args.bucket_bytes:
            for _ in actor.weight_buckets(bucket_bytes, torch.float32):
                pass
    if dist.get_rank() == 0:
        torch.save(result, args.out / "zero3.pt")
    dist.barrier()


def zero3_rollout(args, roles, seen) -> None:
    engine = engine_of(tiny_causal_lm("llama", seed=1), "float32")
    assert roles.push is not None
    found = []
    for bucket_bytes in args.bucket_bytes:
        WeightPush(roles.push, 0, bucket_bytes, torch.float32).receive(engine)
        found.append(engine_weights(engine))
    full = roles.push.broadcast_object(None, 0)
    model = tiny_causal_lm("llama", seed=1)
    model.load_state_dict(full)
    want = engine_weights(engine_of(model, "float32"))
    result = {"seen": seen, "found": found, "want": want, "world": dist.get_world_size()}
    torch.save(result, args.out / "zero3_rollout.pt")


def lost(args) -> None:
    """World rank `--die` leaves without a word while the other waits on it: in a push (the
    rollout rank receiving) or in a gather of rows (the trainer)."""
    roles = split_world(1, "gloo", TIMEOUT)
    if roles.world_rank == args.die:
        os._exit(0)  # as a SIGKILL would: no goodbye on any link
    try:
        if roles.role == "rollout":
            push = WeightPush(roles.push, 0, 1 << 20, torch.float32)
            push.receive(engine_of(tiny_causal_lm("llama"), "float32"))
        else:
            roles.bridge.gather_objects("rows?")
        outcome = {"raised": None, "lost_peer": False}
    except Exception as err:
        outcome = {"raised": repr(err)[:300], "lost_peer": lost_peer(err)}
    torch.save(outcome, args.out / f"lost_{roles.role}.pt")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["wire", "zero3", "lost"], required=True)
    parser.add_argument("--bucket-bytes", type=int, nargs="+", default=[1 << 20])
    parser.add_argument("--die", type=int, default=-1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    {"wire": wire, "zero3": zero3, "lost": lost}[args.mode](args)


if __name__ == "__main__":
    main()
