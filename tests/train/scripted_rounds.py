"""Scripted dynamic-sampling rounds (no engine, no reward) and the two-rank gloo worker that
pools them (tests/train/test_dynamic_sampling.py). A light module: the spawned ranks import it,
not the test file with its trainer."""

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from sparrow.distributed import Ranks
from sparrow.monitor.rollout_plan import RolloutPlan
from sparrow.rollout.outputs import GenerateStats
from sparrow.tasks.rewards import BatchScores, RewardStats
from sparrow.train.dynamic_sampling import DynamicSamplingConfig, Rollout, Round, sample_step

G = 2  # samples per group in the scripted rounds


@dataclass
class Output:  # the fields of the engine's GenerationOutput that merging and pooling touch
    prompt_index: int
    text: str
    logits: object = None


def scripted_round(tag: str, group_scores: list[list[float]]) -> Round:
    """A scripted round: prompts `tag0, tag1, ...` with the given per-group scores; the last
    prompt's group is a dense noise-floor group and every row keeps its logits."""
    n = len(group_scores)
    outputs = [Output(p, f"{tag}{p}/{j}") for p in range(n) for j in range(G)]
    floor = torch.tensor([p == n - 1 for p in range(n) for _ in range(G)])
    plan = RolloutPlan(1, floor, [None if f else "sparse" for f in floor.tolist()], [True] * n * G)
    stats = GenerateStats(num_preemptions=1, decode_s=1.0, decode_tokens=10)
    scores = torch.tensor([s for group in group_scores for s in group])
    extras = [{"row": f"{tag}{i // G}/{i % G}"} for i in range(n * G)]
    reward_stats = RewardStats(calls=n * G)
    prompts = [f"{tag}{p}" for p in range(n)]
    return Round(
        prompts, Rollout(outputs, None, plan, stats), BatchScores(scores, extras, reward_stats)
    )


def collate(prompts, outputs, plan, stats) -> Rollout:
    for o in outputs:  # every output must point at its own prompt among the picked ones
        assert o.text.startswith(prompts[o.prompt_index] + "/")
    return Rollout(outputs, "collated", plan, stats)


# Per case: the round limit, and per rank, per round, each group's scores (share 2: 4 groups).
TWO_RANK_CASES = {
    # Rank 0 holds 3 signal groups after round 2, rank 1 one: the step is full after 2 rounds.
    "pooled": (
        3,
        {
            0: [[[0, 1], [1, 0]], [[0, 0], [1, 0]], [[1, 0], [1, 0]]],
            1: [[[0, 0], [0, 0]], [[1, 0], [0, 0]], [[0, 0], [0, 0]]],
        },
    ),
    # Rank 1 never draws a group with signal; rank 0 three in 2 rounds, the limit.
    "one_rank_none": (
        2,
        {
            0: [[[0, 1], [1, 1]], [[1, 0], [0, 1]]],
            1: [[[0, 0], [1, 1]], [[0, 0], [0, 0]]],
        },
    ),
}


def two_rank_worker(rank: int, init_file: str, out_dir: str) -> None:
    """Every case of TWO_RANK_CASES on this rank of a 2-rank gloo group; what it trained goes to
    out_dir/rank{rank}.json, per case."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    results = {}
    for case, (max_rounds, scripts) in TWO_RANK_CASES.items():
        rounds = [scripted_round(f"r{rank}x{i}-", s) for i, s in enumerate(scripts[rank])]
        script = iter(rounds)
        cfg = DynamicSamplingConfig(enabled=True, max_rounds=max_rounds)
        sampled = sample_step(lambda s=script: next(s), cfg, 2, G, Ranks(rank, 2), collate)
        train = sampled.train
        results[case] = {
            "draws": len(rounds) - sum(1 for _ in script),  # the rounds not drawn are left
            "train": train.prompts,
            "texts": [o.text for o in train.rollout.outputs],
            "scores": train.scores.scores.tolist(),
            "logit_rows": train.rollout.plan.logit_rows,
            "padding": sampled.padding.tolist(),
            "metrics": sampled.metrics,
        }
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()
