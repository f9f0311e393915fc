"""Dynamic sampling (sparrow/train/dynamic_sampling.py, DAPO arXiv 2503.14476): the round loop on
scripted rounds, and the real GRPO loop (tiny preset, FakeActor) with a deterministic reward: a
step never trains on fewer groups with signal than configured unless the round limit was hit, and
then it says so."""

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from fake_actor import FakeActor

from sparrow.cli.config_loader import load_config
from sparrow.distributed import Ranks
from sparrow.monitor.rollout_plan import Rollout, RolloutPlan
from sparrow.rollout.outputs import GenerateStats
from sparrow.tasks.rewards import BatchScores, RewardResult, RewardStats
from sparrow.train.dynamic_sampling import (
    DynamicSamplingConfig,
    Round,
    group_signal,
    sample_step,
)
from sparrow.train.trainer import GRPOTrainer

G = 2  # samples per group in the scripted rounds


@dataclass
class _Output:  # the fields of the engine's GenerationOutput that merging touches
    prompt_index: int
    text: str


def _round(tag: str, group_scores: list[list[float]]) -> Round:
    """A scripted round: prompts `tag0, tag1, ...` with the given per-group scores; the last
    prompt's group is a dense noise-floor group and every row keeps its logits."""
    n = len(group_scores)
    outputs = [_Output(p, f"{tag}{p}/{j}") for p in range(n) for j in range(G)]
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


def _collate(prompts, outputs, plan, stats) -> Rollout:
    for o in outputs:  # every output must point at its own prompt among the picked ones
        assert o.text.startswith(prompts[o.prompt_index] + "/")
    return Rollout(outputs, "collated", plan, stats)


def _sample(rounds: list[Round], cfg: DynamicSamplingConfig, share: int):
    script = iter(rounds)
    calls = []
    sampled = sample_step(
        lambda: calls.append(1) or next(script), cfg, share, G, Ranks(0, 1), _collate
    )
    return sampled, len(calls)


def test_group_signal():
    assert group_signal(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5]), 2) == [False, True, False]


def test_off_is_one_round_trained_whole():
    first = _round("a", [[0, 0], [1, 0]])
    sampled, calls = _sample([first], DynamicSamplingConfig(enabled=False), share=2)
    assert calls == 1 and sampled.train is first and sampled.drawn is first
    assert sampled.metrics == {}


def test_rounds_until_the_share_holds_signal_then_stop():
    rounds = [
        _round("a", [[0, 0], [1, 0], [1, 1]]),  # one group with signal
        _round("b", [[0, 1], [0, 0], [2, 1]]),  # two more: 3 >= share, stop here
        _round("c", [[0, 1], [0, 1], [0, 1]]),  # never drawn
    ]
    cfg = DynamicSamplingConfig(enabled=True, max_rounds=5)
    sampled, calls = _sample(rounds, cfg, share=3)
    assert calls == 2
    train = sampled.train
    assert train.prompts == ["a1", "b0", "b2"]  # the signal groups, in draw order
    assert [o.text for o in train.rollout.outputs] == [
        "a1/0",
        "a1/1",
        "b0/0",
        "b0/1",
        "b2/0",
        "b2/1",
    ]
    assert [o.prompt_index for o in train.rollout.outputs] == [0, 0, 1, 1, 2, 2]
    assert train.scores.scores.tolist() == [1, 0, 0, 1, 2, 1]
    assert [e["row"] for e in train.scores.extras][::2] == ["a1/0", "b0/0", "b2/0"]
    # b2 was its round's noise-floor prompt: its rows stay dense in the merged plan.
    assert train.rollout.plan.floor_rows.tolist() == [False] * 4 + [True] * 2
    assert train.rollout.plan.num_floor == 1
    assert train.rollout.plan.schedules == ["sparse"] * 4 + [None] * 2
    # The step's rollout work and reward calls are those of both rounds.
    assert train.rollout.stats.num_preemptions == 2 and train.rollout.stats.decode_tokens == 20
    assert train.scores.stats.calls == 12
    assert sampled.metrics == {
        "sampling/groups_drawn": 6.0,
        "sampling/groups_kept": 3.0,
        "sampling/groups_dropped": 3.0,
        "sampling/rounds": 2.0,
        "sampling/round_limit_hit": 0.0,
    }
    assert sampled.drawn.prompts == ["a0", "a1", "a2", "b0", "b1", "b2"]


def test_more_signal_than_needed_trains_on_the_share():
    sampled, calls = _sample(
        [_round("a", [[0, 1], [1, 0], [2, 0]])], DynamicSamplingConfig(True), 2
    )
    assert calls == 1 and sampled.train.prompts == ["a0", "a1"]
    assert sampled.metrics["sampling/groups_kept"] == 2.0
    assert sampled.metrics["sampling/groups_dropped"] == 1.0  # beyond the step's need


def test_round_limit_trains_on_what_was_kept_and_says_so():
    rounds = [_round("a", [[0, 0], [1, 0]]), _round("b", [[1, 1], [0, 0]])]
    sampled, calls = _sample(rounds, DynamicSamplingConfig(True, max_rounds=2), share=2)
    assert calls == 2 and sampled.train.prompts == ["a1"]
    assert sampled.metrics["sampling/round_limit_hit"] == 1.0
    assert sampled.metrics["sampling/groups_kept"] == 1.0


def test_a_step_without_any_signal_falls_back_to_its_last_round():
    rounds = [_round("a", [[0, 0], [1, 1]]), _round("b", [[0, 0], [0, 0]])]
    sampled, _ = _sample(rounds, DynamicSamplingConfig(True, max_rounds=2), share=2)
    assert sampled.train is rounds[1]  # zero advantages: the update is skipped downstream
    assert sampled.metrics["sampling/groups_kept"] == 0.0
    assert sampled.metrics["sampling/round_limit_hit"] == 1.0


def test_config_refuses_zero_rounds():
    with pytest.raises(ValueError, match="max_rounds must be >= 1"):
        DynamicSamplingConfig(enabled=True, max_rounds=0)


# ---- the real loop ----------------------------------------------------------------------------


def _prompt_has_signal(prompt: str) -> bool:
    return zlib.crc32(prompt.encode()) % 2 == 0  # about half of the prompts


def _trainer(run_dir, steps: int, max_rounds: int) -> GRPOTrainer:
    overrides = ["preset=tiny", "rl.eval.every=0", "rl.save_every=0", f"rl.steps={steps}"]
    overrides += [
        "rl.dynamic_sampling.enabled=true",
        f"rl.dynamic_sampling.max_rounds={max_rounds}",
    ]
    trainer = GRPOTrainer(load_config([*overrides, f"run_dir={run_dir}"]), FakeActor)
    calls = []

    def reward(prompt, completion, reference):
        """Deterministic: a third of the prompts score their group's first sample 1, others 0
        (score_batch calls the reward prompt-major, group_size samples per prompt)."""
        calls.append(1)
        first = (len(calls) - 1) % trainer.cfg.rl.group_size == 0
        return RewardResult(float(first and _prompt_has_signal(prompt)))

    trainer.reward.fn = reward
    return trainer


@pytest.mark.parametrize("steps, max_rounds", [(4, 3), (2, 1)])
def test_a_step_trains_on_its_share_of_signal_groups_unless_the_round_limit_hit(
    tmp_path, steps, max_rounds
):
    """With up to 3 rounds every step of this data fills its 4 groups (in 2-3 rounds); with one
    round a step keeps only the half of its prompts that carry signal, and says so."""
    trainer = _trainer(tmp_path, steps, max_rounds)
    trained = []
    real_train_step = trainer.actor.train_step

    def recording(micro_batches, loss_fn, temperature):
        groups = torch.cat([mb["group_ids"][mb["advantages"].ne(0).any(1)] for mb in micro_batches])
        rows = sum(len(mb["group_ids"]) for mb in micro_batches)
        trained.append((len(groups.unique()), rows))
        return real_train_step(micro_batches, loss_fn, temperature)

    trainer.actor.train_step = recording
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    target, group_size = trainer.cfg.rl.prompts_per_step, trainer.cfg.rl.group_size
    assert len(rows) == steps and len(trained) == steps  # every step kept some signal
    for row, (signal_groups, batch_rows) in zip(rows, trained, strict=True):
        kept, hit = row["sampling/groups_kept"], row["sampling/round_limit_hit"]
        assert signal_groups == kept and batch_rows == kept * group_size  # only signal groups
        assert kept == target or (hit == 1.0 and kept < target)
        assert row["sampling/rounds"] <= max_rounds and (
            not hit or row["sampling/rounds"] == max_rounds
        )
        assert row["sampling/groups_drawn"] == row["sampling/rounds"] * target
        assert row["sampling/groups_dropped"] == row["sampling/groups_drawn"] - kept
        assert row["update/no_signal"] == 0.0
    if max_rounds > 1:  # the data needed more than one round, and got its groups
        assert {r["sampling/rounds"] for r in rows} != {1.0}
        assert all(r["sampling/groups_kept"] == target for r in rows)
    else:
        assert any(r["sampling/round_limit_hit"] == 1.0 for r in rows)
    # The data order: the prompt iterator moved by every round's prompts, nothing else.
    drawn = int(sum(r["sampling/groups_drawn"] for r in rows))
    position = trainer.prompts.epoch * (len(trainer.train_data) // target * target)
    assert position + trainer.prompts.position == drawn
    # The plan line and the console line say it.
    assert (
        f"until 4 groups have rewards not all equal, at most {max_rounds} rounds" in trainer.plan()
    )


# ---- two ranks ----------------------------------------------------------------------------------

RANK_SCRIPTS = {  # per rank, per round: each group's scores (share 2, up to 3 rounds)
    0: [[[0, 1], [1, 0]], [[0, 0], [1, 0]], [[1, 0], [1, 0]]],  # its 2 groups in round 1
    1: [[[0, 0], [0, 0]], [[1, 0], [0, 0]], [[0, 0], [0, 0]]],  # 1 group after 3 rounds
}


def _two_rank_worker(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    rounds = [_round(f"r{rank}x{i}-", scores) for i, scores in enumerate(RANK_SCRIPTS[rank])]
    cfg = DynamicSamplingConfig(enabled=True, max_rounds=3)
    script = iter(rounds)
    drawn = []
    sampled = sample_step(
        lambda: drawn.append(1) or next(script), cfg, 2, G, Ranks(rank, 2), _collate
    )
    result = {"draws": len(drawn), "train": sampled.train.prompts, "metrics": sampled.metrics}
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def test_two_ranks_run_the_same_rounds_and_train_as_many_groups(tmp_path):
    """Rank 0 has its share after one round, rank 1 never does: both draw until the limit, and
    both train on the one group rank 1 kept (equal micro-batches on every rank)."""
    import torch.multiprocessing as mp

    mp.spawn(_two_rank_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["draws"] == r1["draws"] == 3
    assert r0["train"] == ["r0x0-0"] and r1["train"] == ["r1x1-0"]
    assert (
        r0["metrics"]
        == r1["metrics"]
        == {
            "sampling/groups_drawn": 12.0,
            "sampling/groups_kept": 2.0,
            "sampling/groups_dropped": 10.0,
            "sampling/rounds": 3.0,
            "sampling/round_limit_hit": 1.0,
        }
    )
