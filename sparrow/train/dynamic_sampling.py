"""DAPO's dynamic sampling (arXiv 2503.14476, §3.2 "Dynamic Sampling"): draw prompts in rounds
until the step holds `rl.prompts_per_step` groups whose rewards are not all equal, and train on
those alone. A group whose samples all scored the same has zero advantages: it adds no gradient,
only tokens to the step's token mean (diluting the rest), and when every group is like that the
step has nothing to learn from (at a small sparse budget most steps are: docs/parity/README.md).

Each round every rank rolls out its share of a fresh batch of `rl.prompts_per_step` prompts (the
same prompt iterator on every rank, so the data order is the uninterrupted run's, whatever the
number of rounds) and keeps its groups with signal. The rounds stop when every rank holds its
share (`prompts_per_step / world` groups), or after `max_rounds`; the decision is global, so all
ranks run the same rounds. Every rank then trains on the same number of groups (the smallest any
rank kept, capped at its share, so that the actor's micro-batches match across ranks); a step
that kept none trains on its last round, as a step without dynamic sampling would, and its
advantages decide whether the update is skipped (`rl.skip_no_signal`). A kill mid-round loses
the step in flight only: the prompt iterator and the engine's sampling stream are checkpointed
at step boundaries, so the resumed step draws the same rounds again.

    sampled = sample_step(draw_round, cfg, share, group_size, ranks, collate)
"""

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch

from sparrow.distributed import Ranks
from sparrow.monitor.rollout_plan import Rollout, RolloutPlan
from sparrow.tasks.rewards import BatchScores, RewardStats

# What a step with dynamic sampling logs (the dashboard's dynamic_sampling panel reads them).
SAMPLING_METRICS = (
    "sampling/groups_drawn",
    "sampling/groups_kept",
    "sampling/groups_dropped",
    "sampling/rounds",
    "sampling/round_limit_hit",
)


@dataclass
class DynamicSamplingConfig:
    # Draw rounds of rl.prompts_per_step prompts until the step holds that many groups whose
    # rewards are not all equal (DAPO's dynamic sampling); off: one round, every group trained.
    enabled: bool = False
    max_rounds: int = 4  # rounds per step at most; then the step trains on what it kept

    def __post_init__(self):
        if self.max_rounds < 1:
            raise ValueError(f"rl.dynamic_sampling.max_rounds must be >= 1, got {self.max_rounds}")


@dataclass
class Round:
    """One round on this rank: its prompts and what was rolled out and scored for them."""

    prompts: list  # this rank's prompts (tasks.data.Prompt), group_size samples each
    rollout: Rollout
    scores: BatchScores  # (len(prompts) * group_size,), prompt-major like the outputs


@dataclass
class Sampled:
    train: Round  # the groups the step trains on
    drawn: Round  # every group rolled out this step (what the rollout metrics describe)
    metrics: dict[str, float]  # sampling/*: empty without dynamic sampling


def group_signal(scores: torch.Tensor, group_size: int) -> list[bool]:
    """Per group of a prompt-major (P * group_size,) score vector: are its rewards not all equal?"""
    grouped = scores.reshape(-1, group_size)  # (P, G)
    return (grouped.amax(1) != grouped.amin(1)).tolist()


def sample_step(
    draw: Callable[[], Round],
    cfg: DynamicSamplingConfig,
    share: int,
    group_size: int,
    ranks: Ranks,
    collate: Callable[[list, list, RolloutPlan, object], Rollout],
) -> Sampled:
    """The step's rounds (`draw()` rolls out and scores one round of this rank's prompts) and
    the groups it trains on; `share` is this rank's groups per step, `collate(prompts, outputs,
    plan, stats)` builds a Rollout of picked groups. Collective: all ranks call it together."""
    first = draw()
    if not cfg.enabled:
        return Sampled(first, first, {})
    rounds, picks = [first], []
    while True:
        last = len(rounds) - 1
        picks += [
            (last, p)
            for p, s in enumerate(group_signal(rounds[last].scores.scores, group_size))
            if s
        ]
        fewest = int(ranks.extreme([float(len(picks))], "min"))
        if fewest >= share or len(rounds) == cfg.max_rounds:
            break
        rounds.append(draw())
    num_train = min(share, fewest)
    if num_train == 0:  # nothing kept anywhere in common: the last round, as without sampling
        train = rounds[-1]
        kept = sum(group_signal(train.scores.scores, group_size))
    else:
        train = merge(rounds, picks[:num_train], group_size, collate)
        kept = num_train
    drawn = sum(len(r.prompts) for r in rounds)
    totals = ranks.sums({"drawn": float(drawn), "kept": float(kept)})
    values = (
        totals["drawn"],
        totals["kept"],
        totals["drawn"] - totals["kept"],
        float(len(rounds)),
        float(fewest < share),
    )
    metrics = dict(zip(SAMPLING_METRICS, values, strict=True))
    every = [(r, p) for r, rnd in enumerate(rounds) for p in range(len(rnd.prompts))]
    everything = rounds[0] if len(rounds) == 1 else merge(rounds, every, group_size, collate)
    return Sampled(train, everything, metrics)


def merge(
    rounds: list[Round],
    picks: list[tuple[int, int]],
    group_size: int,
    collate: Callable[[list, list, RolloutPlan, object], Rollout],
) -> Round:
    """The groups `picks` ((round, prompt) pairs, in that order) as one Round: outputs renumbered
    to their place among the picked prompts, the plan's rows and the scores taken along; the
    engine stats and reward counts are those of all `rounds` (the step's rollout work)."""
    prompts, outputs, rows = [], [], []
    for new_index, (r, p) in enumerate(picks):
        prompts.append(rounds[r].prompts[p])
        group = rounds[r].rollout.outputs[p * group_size : (p + 1) * group_size]
        outputs += [replace(o, prompt_index=new_index) for o in group]
        rows += [(r, p * group_size + j) for j in range(group_size)]
    plan = _merge_plans([rounds[r].rollout.plan for r in range(len(rounds))], rows, group_size)
    stats = _sum_dataclass([r.rollout.stats for r in rounds])
    reward_stats = RewardStats()
    for rnd in rounds:
        reward_stats.add(rnd.scores.stats)
    scores = BatchScores(
        torch.stack([rounds[r].scores.scores[i] for r, i in rows]),
        [rounds[r].scores.extras[i] for r, i in rows],
        reward_stats,
    )
    return Round(prompts, collate(prompts, outputs, plan, stats), scores)


def _merge_plans(plans: list[RolloutPlan], rows: list[tuple[int, int]], group_size: int):
    """The RolloutPlan of the sequences `rows` ((round, row) pairs)."""
    floor = torch.stack([plans[r].floor_rows[i] for r, i in rows])  # (B,)
    schedules = None
    if any(p.schedules is not None for p in plans):
        schedules = [plans[r].schedules[i] for r, i in rows]
    logit_rows = None
    if any(p.logit_rows is not None for p in plans):
        logit_rows = [plans[r].logit_rows[i] for r, i in rows]
    return RolloutPlan(int(floor.sum()) // group_size, floor, schedules, logit_rows)


def _sum_dataclass(items: list):
    """Field-wise sum of numeric dataclasses (the engine's GenerateStats of each round)."""
    first = items[0]
    return replace(first, **{f.name: sum(getattr(i, f.name) for i in items) for f in fields(first)})
