"""DAPO's dynamic sampling (arXiv 2503.14476, §3.2 "Dynamic Sampling"): draw prompts in rounds
until the step holds `rl.prompts_per_step` groups whose rewards are not all equal, and train on
those alone. A group whose samples all scored the same has zero advantages: it adds no gradient,
only tokens to the step's token mean (diluting the rest), and when every group is like that the
step has nothing to learn from (at a small sparse budget most steps are: docs/parity/README.md).

Each round every rank rolls out its share of a fresh batch of `rl.prompts_per_step` prompts (the
same prompt iterator on every rank, so the data order is the uninterrupted run's, whatever the
number of rounds) and keeps its groups with signal. The groups are pooled over ranks, as DAPO
pools them in one batch (verl 0.9.1: one driver filters the whole batch, then spreads it over the
data-parallel ranks): the rounds stop when all ranks together hold `prompts_per_step` groups, or
after `max_rounds`, and the step trains on the first `prompts_per_step` of them in draw order
(the round, then the prompt's place in the round's batch), the rest dropped as verl drops its
surplus. No rank drops a signal group because another rank has fewer: each trains as many groups
(`pool`), keeping its own and handing its surplus to ranks short of theirs. When the groups do not
divide evenly (round limit hit), a rank one short trains one of its own unpicked groups as padding,
out of the loss (`Sampled.padding`), so that the actor's micro-batches match across ranks. A step
that kept none trains on its last round, as a step without dynamic sampling would, and its
advantages decide whether the update is skipped (`rl.skip_no_signal`). A kill mid-round loses
the step in flight only: the prompt iterator and the engine's sampling stream are checkpointed
at step boundaries, so the resumed step draws the same rounds again.

    sampled = sample_step(draw_round, cfg, share, group_size, ranks, collate)
"""

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import reduce
from operator import add
from typing import cast

import torch

from sparrow.distributed import Ranks
from sparrow.monitor.rollout_plan import RolloutPlan
from sparrow.rl.batch import RolloutBatch
from sparrow.rollout.outputs import GenerateStats
from sparrow.tasks.rewards import BatchScores
from sparrow.train.config import DynamicSamplingConfig

# What a step with dynamic sampling logs (the dashboard's dynamic_sampling panel reads them).
SAMPLING_METRICS = (
    "sampling/groups_drawn",
    "sampling/groups_kept",
    "sampling/groups_dropped",
    "sampling/rounds",
    "sampling/round_limit_hit",
)


@dataclass
class Rollout:
    """One round of the step: the engine's outputs with their batch and the plan they ran under."""

    outputs: list  # the engine's GenerationOutputs, prompt-major, rl.group_size per prompt
    batch: RolloutBatch
    plan: RolloutPlan  # which rows were dense (noise floor) and kept their logits
    stats: GenerateStats  # of the engine's generate call(s) (decode tok/s)

    def free_logits(self) -> None:
        """Drop the (C_b, V) rollout logits the batch and its outputs hold (read by the
        acceptance, not needed after it)."""
        self.batch.rollout_logits = None
        for o in self.outputs:
            o.logits = None


Collate = Callable[[list, list, RolloutPlan, object], Rollout]
GroupKey = tuple[int, int]  # (round, prompt index in this rank's share of the round)


@dataclass
class Round:
    """One round on this rank: its prompts and what was rolled out and scored for them."""

    prompts: list  # this rank's prompts (tasks.data.Prompt), group_size samples each
    rollout: Rollout
    scores: BatchScores  # (len(prompts) * group_size,), prompt-major like the outputs


@dataclass
class Sampled:
    train: Round  # the groups the step trains on
    drawn: Round  # every group this rank rolled out this step (what the rollout metrics describe)
    metrics: dict[str, float]  # sampling/*: empty without dynamic sampling
    # (B,) bool, rows of `train` that only even out the ranks' group counts (out of the loss);
    # None without dynamic sampling
    padding: torch.Tensor | None = None
    # Asynchronous rollout: (AcceptanceResult, controller metrics), the step's acceptance
    # measured and the schedule moved as the rollout was taken; None: done after the update
    steered: tuple | None = None

    def free_logits(self) -> None:
        """Drop the rollout logits of every group drawn, trained or not: the one place they are
        freed, once the monitor has read them (the update needs none)."""
        self.train.rollout.free_logits()
        self.drawn.rollout.free_logits()


@dataclass
class Group:
    """One prompt's group_size samples and what the step trains them with."""

    prompt: object  # tasks.data.Prompt
    outputs: list  # the engine's GenerationOutputs, group_size of them
    floor: torch.Tensor  # (G,) bool, rolled out densely (the noise floor)
    schedules: list | None  # per sample, as RolloutPlan.schedules
    logit_rows: list[bool] | None  # per sample, as RolloutPlan.logit_rows
    scores: torch.Tensor  # (G,)
    extras: list[dict]

    def portable(self) -> "Group":
        """This group for another rank: without the kept logits (T x V per sample, on this
        rank's device), so the receiving rank's exact acceptance leaves its rows out."""
        outputs = [replace(o, logits=None) for o in self.outputs]
        logit_rows = None if self.logit_rows is None else [False] * len(self.logit_rows)
        return replace(self, outputs=outputs, logit_rows=logit_rows)


def staleness_metrics(step: int, versions: torch.Tensor, ranks: Ranks) -> dict[str, float]:
    """async/staleness (mean over all ranks' rows) and async/staleness_max: how many weight
    versions (steps) behind the trained weights (`step` updates in) each row was sampled."""
    behind = step - versions  # (B,)
    return {
        "async/staleness": ranks.mean(float(behind.sum()), len(behind)),
        "async/staleness_max": ranks.extreme([float(behind.max())], "max"),
    }


def group_signal(scores: torch.Tensor, group_size: int) -> list[bool]:
    """Per group of a prompt-major (P * group_size,) score vector: does it carry signal? Its
    rewards are not all equal, or it is a group of one, as verl 0.9.1's DAPO filter keeps
    `np.std(rewards) > 0 or len == 1` (v1/replay_buffer.py `_dapo_filtered_keys`). Equality is
    exact here, where np.std rounds three equal rewards of 0.1 to 1.4e-17 and keeps them."""
    grouped = scores.reshape(-1, group_size)  # (P, G)
    return ((grouped.amax(1) != grouped.amin(1)) | (group_size == 1)).tolist()


def sample_step(
    draw: Callable[[], Round],
    cfg: DynamicSamplingConfig,
    share: int,
    group_size: int,
    ranks: Ranks,
    collate: Collate,
) -> Sampled:
    """The step's rounds (`draw()` rolls out and scores one round of this rank's prompts) and
    the groups it trains on; `share` is this rank's groups per step, `collate(prompts, outputs,
    plan, stats)` builds a Rollout of picked groups. Collective: all ranks call it together."""
    first = draw()
    if not cfg.enabled:
        return Sampled(first, first, {})
    target = share * ranks.world  # rl.prompts_per_step
    rounds: list[Round] = [first]
    picks: list[GroupKey] = []  # this rank's groups with signal, in draw order
    while True:
        last = len(rounds) - 1
        signal = group_signal(rounds[last].scores.scores, group_size)
        picks += [(last, p) for p, s in enumerate(signal) if s]
        total = int(ranks.sum(len(picks)))
        if total >= target or len(rounds) == cfg.max_rounds:
            break
        rounds.append(draw())
    if total == 0:  # nothing kept on any rank: the last round, as without sampling
        train = rounds[-1]
        padding = torch.zeros(len(train.scores.scores), dtype=torch.bool)
    else:
        train, padding = pool(rounds, picks, target, group_size, ranks, collate)
    kept = min(total, target)
    drawn = ranks.sum(sum(len(r.prompts) for r in rounds))
    values = (drawn, kept, drawn - kept, len(rounds), total < target)
    metrics = dict(zip(SAMPLING_METRICS, map(float, values), strict=True))
    if len(rounds) == 1:
        everything = rounds[0]
    else:
        keys = [(r, p) for r, rnd in enumerate(rounds) for p in range(len(rnd.prompts))]
        everything = assemble([_group(rounds, k, group_size) for k in keys], rounds, collate)
    return Sampled(train, everything, metrics, padding)


def pool(
    rounds: list[Round],
    picks: list[GroupKey],
    target: int,
    group_size: int,
    ranks: Ranks,
    collate: Collate,
) -> tuple[Round, torch.Tensor]:
    """This rank's part of the step's first `target` signal groups over all ranks (every rank's
    `picks`, in draw order), and its (B,) bool padding rows. Collective.

    Each rank trains n = ceil(N / world) groups, N the groups picked: its own first, up to its
    quota (n, or n - 1 for the ranks holding fewest when N does not divide), the others handed
    to ranks short of theirs; a rank on n - 1 adds one of its own groups it does not train,
    as padding. Every rank computes the same plan from the gathered picks."""
    rank, world = ranks.rank, ranks.world
    everyone = ranks.gather(picks)  # per rank, its picks
    # Draw order: the round, then the prompt's place in the round's batch, which the trainer
    # deals out strided (rank q's prompt p is the batch's prompt p * world + q).
    order = sorted((r, p * world + q, q) for q, keys in enumerate(everyone) for r, p in keys)
    picked: list[list[GroupKey]] = [[] for _ in range(world)]
    for r, place, q in order[:target]:
        picked[q].append((r, place // world))
    num_picked = sum(map(len, picked))
    n, extra = -(-num_picked // world), num_picked % world
    fullest = sorted(range(world), key=lambda q: (-len(picked[q]), q))
    quota = [n if extra == 0 or q in fullest[:extra] else n - 1 for q in range(world)]
    surplus = [(q, key) for q in range(world) for key in picked[q][quota[q] :]]
    short = [q for q in range(world) for _ in range(quota[q] - len(picked[q]))]
    moves = list(zip(surplus, short, strict=True))  # ((from rank, its key), to rank)
    own = picked[rank][: quota[rank]]
    groups = [_group(rounds, key, group_size) for key in own]
    if moves:  # every rank knows the moves, so all of them call the collective or none
        mine = [key for (src, key), _ in moves if src == rank]
        outgoing = [_group(rounds, key, group_size).portable() for key in mine]
        arrived = [g for part in ranks.gather(outgoing) for g in part]  # in the order of moves
        groups += [g for g, (_, dst) in zip(arrived, moves, strict=True) if dst == rank]
    padding = [False] * len(groups) * group_size
    if quota[rank] < n:  # one short: pad with a group no rank trains, else one handed on
        local = [(r, p) for r, rnd in enumerate(rounds) for p in range(len(rnd.prompts))]
        handed_on = [key for key in picked[rank] if key not in own]
        spare = [key for key in local if key not in picked[rank]] + handed_on
        groups.append(_group(rounds, spare[0], group_size))  # one exists: quota < n <= share
        padding += [True] * group_size
    return assemble(groups, rounds, collate), torch.tensor(padding)


def _group(rounds: list[Round], key: GroupKey, group_size: int) -> Group:
    """Group `key` ((round, prompt)) of this rank's rounds."""
    rnd, p = rounds[key[0]], key[1]
    rows = slice(p * group_size, (p + 1) * group_size)
    plan = rnd.rollout.plan
    return Group(
        rnd.prompts[p],
        rnd.rollout.outputs[rows],
        plan.floor_rows[rows],
        None if plan.schedules is None else plan.schedules[rows],
        None if plan.logit_rows is None else plan.logit_rows[rows],
        rnd.scores.scores[rows],
        rnd.scores.extras[rows],
    )


def assemble(groups: list[Group], rounds: list[Round], collate: Collate) -> Round:
    """`groups` as one Round: outputs renumbered to their group's place, the plan's rows and the
    scores taken along; the engine stats and reward counts are those of all `rounds` (this
    rank's rollout work for the step)."""
    prompts = [g.prompt for g in groups]
    outputs = [replace(o, prompt_index=i) for i, g in enumerate(groups) for o in g.outputs]
    floor = torch.cat([g.floor for g in groups])  # (B,)
    schedules = None
    if any(g.schedules is not None for g in groups):
        schedules = [s for g in groups for s in cast(list, g.schedules)]  # all or none
    logit_rows = None
    if any(g.logit_rows is not None for g in groups):
        logit_rows = [x for g in groups for x in cast(list, g.logit_rows)]  # all or none
    group_size = len(groups[0].outputs)
    plan = RolloutPlan(int(floor.sum()) // group_size, floor, schedules, logit_rows)
    stats = _sum_dataclass([r.rollout.stats for r in rounds])
    reward_stats = type(rounds[0].scores.stats)()  # episodes' keep their env/* counts too
    for rnd in rounds:
        reward_stats.add(rnd.scores.stats)
    scores = BatchScores(
        torch.cat([g.scores for g in groups]), [e for g in groups for e in g.extras], reward_stats
    )
    return Round(prompts, collate(prompts, outputs, plan, stats), scores)


def _sum_dataclass(items: list):
    """Field-wise sum of dataclasses of numbers and addables (the engine's GenerateStats of each
    round: its counts, times and speculative DraftAcceptance)."""
    first = items[0]
    return replace(
        first, **{f.name: reduce(add, (getattr(i, f.name) for i in items)) for f in fields(first)}
    )
