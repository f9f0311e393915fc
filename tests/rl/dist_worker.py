"""Worker for tests/rl/test_distributed.py: a few DenseActor steps on a shard of a global batch.

Run under torchrun (any world size) or plain `python` (1 rank). Every rank takes its contiguous
share of the same global batch, trains `--steps` steps and saves the gathered weights and the
step metrics to `--out/zero{stage}_rank{r}.pt`, for each ZeRO stage asked for. With
`--resume-check`, it then saves a checkpoint, takes one more step, reloads the checkpoint into a
freshly built (differently initialised) actor, repeats that step and records both results.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for tiny_lm
from tiny_lm import pg_loss_fn, rl_batch, tiny_causal_lm  # noqa: E402

from sparrow.rl.actor import DenseActor  # noqa: E402
from sparrow.rl.actor_config import ActorConfig  # noqa: E402
from sparrow.rl.micro_batches import split_micro_batches  # noqa: E402
from sparrow.train.run.checkpoint import CheckpointManager  # noqa: E402


def run_step(actor, step, global_batch, micro_batch_size):
    batch = rl_batch(global_batch, 16, seed=100 + step)
    loss_fn = pg_loss_fn(int(batch["completion_mask"].sum()))  # global count, same on all ranks
    per_rank = global_batch // actor.world_size
    shard = {k: v[actor.rank * per_rank : (actor.rank + 1) * per_rank] for k, v in batch.items()}
    return actor.train_step(split_micro_batches(shard, micro_batch_size), loss_fn)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--zero-stages", type=int, nargs="+", default=[2])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--resume-check", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for stage in args.zero_stages:  # one process start-up (the slow part) serves every stage
        result, rank = run_stage(stage, args)
        torch.save(result, args.out / f"zero{stage}_rank{rank}.pt")
    dist.barrier()


def run_stage(stage, args):
    mbs = args.micro_batch_size
    cfg = ActorConfig(zero_stage=stage, lr=1e-3, micro_batch_size=mbs, precision="fp32")
    actor = DenseActor(tiny_causal_lm("llama", seed=0), cfg)
    metrics = [run_step(actor, s, args.global_batch, mbs) for s in range(args.steps)]
    result = {
        "world_size": actor.world_size,
        "metrics": metrics,
        "params": {k: v.clone() for k, v in actor.gathered_state_dict().items()},
    }
    if args.resume_check:
        manager = CheckpointManager(args.out / f"ckpt_zero{stage}", keep_last=1)
        manager.save(args.steps, {"note": "resume check"}, save_actor=actor.save_checkpoint)
        result["continued"] = run_step(actor, args.steps, args.global_batch, mbs)
        fresh = DenseActor(tiny_causal_lm("llama", seed=1), cfg)
        loaded = manager.load(manager.latest_complete())
        fresh.load_checkpoint(loaded.actor_dir)
        result["resumed"] = run_step(fresh, args.steps, args.global_batch, mbs)
        result["continued_params"] = {k: v.clone() for k, v in actor.gathered_state_dict().items()}
        result["resumed_params"] = {k: v.clone() for k, v in fresh.gathered_state_dict().items()}
    return result, actor.rank


if __name__ == "__main__":
    main()
