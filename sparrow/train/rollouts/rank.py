"""A run's rollout ranks (cluster.rollout_ranks=R under torchrun): the world split into roles, and
what a rollout rank runs instead of the trainer. It loads the model and builds the engine from the
same config as the trainers (their memory fit sizes actor knobs only: the engine is the same), no
actor, no optimizer and no prompts of its own, and serves draws (train/rollouts/remote.py) until
the trainers stop it: for each training rank it serves, a RolloutDraw made for that rank's place
draws what the rank asks for (the prompts, plan, schedule and seed in its request) on the weights
the trainers last pushed.

    roles = join_cluster(cfg)                  # None without rollout ranks
    if roles is not None and roles.role == "rollout":
        serve_rollout_rank(cfg, roles)
"""

import os
from datetime import timedelta

import torch

from sparrow.cluster import Roles, local_device, split_world
from sparrow.distributed import Ranks
from sparrow.models.loading import load_model
from sparrow.rollout.engine import LLMEngine
from sparrow.tasks.rewards import build_reward
from sparrow.train.config import SparrowConfig
from sparrow.train.rollouts.draw import RolloutDraw
from sparrow.train.rollouts.remote import serve_rollouts


def join_cluster(cfg: SparrowConfig) -> Roles | None:
    """This process's role when the run has rollout ranks (torchrun's world split: the training
    ranks over gloo on CPU and NCCL on GPUs, the push as cluster.push_backend), else None.
    Before anything else of the run: the roles' process groups are the ones DeepSpeed and the
    step's sums then use."""
    cluster = cfg.cluster
    if not cluster.rollout_ranks:
        return None
    if "RANK" not in os.environ:
        raise ValueError(
            f"cluster.rollout_ranks={cluster.rollout_ranks} needs a torchrun launch "
            "(scripts/launch_multinode.sh) with more ranks than that"
        )
    check_rollout_ranks(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = timedelta(minutes=cluster.bridge_timeout_min)
    return split_world(cluster.rollout_ranks, backend, timeout, cluster.push_backend)


def check_rollout_ranks(cfg: SparrowConfig, world: int) -> None:
    """What rollout ranks do not run yet in a `world` of ranks, refused in one line each before
    any model loads (on every rank: the rollout ranks stop with the same line)."""
    if cfg.rl.dynamic_sampling.enabled:  # its rounds are decided over every rank's rewards
        raise ValueError("cluster.rollout_ranks with rl.dynamic_sampling is not supported yet")
    if cfg.distill.enabled and cfg.schedule.mode != "dense":  # the push carries theta only
        raise ValueError("cluster.rollout_ranks with distill.enabled is not supported yet")
    trainers = world - cfg.cluster.rollout_ranks
    if cfg.rl.async_rollout.staleness and trainers > 1:  # a checkpoint fetches rank 0's rows
        raise ValueError(
            f"rl.async.staleness=1 with cluster.rollout_ranks runs one training rank for now, "
            f"not {trainers} (WORLD_SIZE={world} less {cfg.cluster.rollout_ranks})"
        )


def serve_rollout_rank(cfg: SparrowConfig, roles: Roles) -> int:
    """A rollout rank's whole run: the engine, then draws until the trainers stop; the number of
    steps drawn (its end line on stdout). The weights are the trainers' first push; the
    sampling seed of every draw comes with its request."""
    loaded = load_model(cfg.model)
    device = local_device()  # the split made it current
    if device.type == "cuda":
        loaded.model.to(device)  # type: ignore[arg-type]  # transformers' wrapped .to
    engine = LLMEngine(
        loaded.model, loaded.tokenizer, cfg.rollout.engine, speculative=cfg.rollout.speculative
    )
    reward = build_reward(cfg.rl.reward)
    trainers = roles.world_size - roles.rollout_ranks
    mine = [i for i in range(trainers) if i % roles.rollout_ranks == roles.world_rank - trainers]
    tokenizer = loaded.tokenizer
    draws = {
        i: RolloutDraw(cfg, engine, _from_request, None, tokenizer, reward, Ranks(i, trainers))
        for i in mine
    }
    bucket_bytes = int(cfg.cluster.push_bucket_mb * 2**20)
    steps = serve_rollouts(
        roles,
        engine,
        lambda step, request, version: draws[request["rank"]].drawn_from(step, request, version),
        bucket_bytes,
    )
    for draw in draws.values():
        draw.close()
    served = ", ".join(map(str, draws))
    print(f"rollout rank {roles.world_rank}: drew {steps} steps for training ranks {served}")
    return steps


def _from_request(num_prompts: int):
    raise AssertionError("a rollout rank's plan comes with each request (drawn_from)")
