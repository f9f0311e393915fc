"""Dynamic sampling (sparrow/train/dynamic_sampling.py, DAPO arXiv 2503.14476): the round loop on
scripted rounds, and the real GRPO loop (tiny preset, FakeActor) with a deterministic reward: a
step never trains on fewer groups with signal than configured unless the round limit was hit, and
then it says so."""

import json
import zlib

import numpy as np
import pytest
import torch
from fake_actor import FakeActor
from scripted_rounds import G, collate, scripted_round, two_rank_worker

from sparrow.cli.config_loader import load_config
from sparrow.distributed import Ranks
from sparrow.tasks.rewards import RewardResult
from sparrow.train.dynamic_sampling import (
    DynamicSamplingConfig,
    Round,
    group_signal,
    sample_step,
)
from sparrow.train.trainer import GRPOTrainer


def _sample(rounds: list[Round], cfg: DynamicSamplingConfig, share: int):
    script = iter(rounds)
    calls = []
    sampled = sample_step(
        lambda: calls.append(1) or next(script), cfg, share, G, Ranks(0, 1), collate
    )
    return sampled, len(calls)


def test_group_signal():
    assert group_signal(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5]), 2) == [False, True, False]


def _verl_dapo_keeps(rewards: list[float]) -> bool:
    """verl 0.9.1's DAPO filter (v1/replay_buffer.py `_dapo_filtered_keys`; the dapo recipe's
    `std > 0 or len == 1`): a group is evicted iff len > 1 and np.std(rewards) == 0."""
    return not (len(rewards) > 1 and float(np.std(rewards)) == 0.0)


def test_group_signal_against_verls_filter():
    """Groups of one carry signal, as in verl; equal rewards do not, even where np.std rounds
    them above 0 (three rewards of 0.1: 1.4e-17, verl keeps them; their advantages are 0 in
    verl's float32 too, so the group would only take a place in the step)."""
    cases = {
        (0.0, 1.0, 1.0): True,
        (1.0, 1.0, 1.0): False,
        (0.5, 0.5 + 2**-20, 0.5): True,  # near-equal, distinct in float32
        (0.1, 0.1, 0.1): False,  # sparrow's one departure
    }
    for rewards, ours in cases.items():
        assert group_signal(torch.tensor(rewards), len(rewards)) == [ours], rewards
        assert _verl_dapo_keeps(list(rewards)) == (ours or rewards == (0.1, 0.1, 0.1)), rewards
    assert float(np.std([0.1, 0.1, 0.1])) == pytest.approx(1.39e-17, rel=0.01)
    for score in (0.0, 1.0):  # groups of one
        assert group_signal(torch.tensor([score, 1.0]), 1) == [True, True]
        assert _verl_dapo_keeps([score])


def test_off_is_one_round_trained_whole():
    first = scripted_round("a", [[0, 0], [1, 0]])
    sampled, calls = _sample([first], DynamicSamplingConfig(enabled=False), share=2)
    assert calls == 1 and sampled.train is first and sampled.drawn is first
    assert sampled.metrics == {}


def test_rounds_until_the_share_holds_signal_then_stop():
    rounds = [
        scripted_round("a", [[0, 0], [1, 0], [1, 1]]),  # one group with signal
        scripted_round("b", [[0, 1], [0, 0], [2, 1]]),  # two more: 3 >= share, stop here
        scripted_round("c", [[0, 1], [0, 1], [0, 1]]),  # never drawn
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
        [scripted_round("a", [[0, 1], [1, 0], [2, 0]])], DynamicSamplingConfig(True), 2
    )
    assert calls == 1 and sampled.train.prompts == ["a0", "a1"]
    assert sampled.metrics["sampling/groups_kept"] == 2.0
    assert sampled.metrics["sampling/groups_dropped"] == 1.0  # beyond the step's need


def test_round_limit_trains_on_what_was_kept_and_says_so():
    rounds = [scripted_round("a", [[0, 0], [1, 0]]), scripted_round("b", [[1, 1], [0, 0]])]
    sampled, calls = _sample(rounds, DynamicSamplingConfig(True, max_rounds=2), share=2)
    assert calls == 2 and sampled.train.prompts == ["a1"]
    assert sampled.metrics["sampling/round_limit_hit"] == 1.0
    assert sampled.metrics["sampling/groups_kept"] == 1.0


def test_a_step_without_any_signal_falls_back_to_its_lastscripted_round():
    rounds = [scripted_round("a", [[0, 0], [1, 1]]), scripted_round("b", [[0, 0], [0, 0]])]
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
    trainer = GRPOTrainer.from_config(load_config([*overrides, f"run_dir={run_dir}"]), FakeActor)
    calls = []

    def reward(prompt, completion, reference):
        """Deterministic: a third of the prompts score their group's first sample 1, others 0
        (score_batch calls the reward prompt-major, group_size samples per prompt)."""
        calls.append(1)
        first = (len(calls) - 1) % trainer.cfg.rl.group_size == 0
        return RewardResult(float(first and _prompt_has_signal(prompt)))

    trainer.draw.reward.fn = reward
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

    def recording(micro_batches, loss_fn, temperature, keep=None):
        groups = torch.cat([mb["group_ids"][mb["advantages"].ne(0).any(1)] for mb in micro_batches])
        rows = sum(len(mb["group_ids"]) for mb in micro_batches)
        trained.append((len(groups.unique()), rows))
        return real_train_step(micro_batches, loss_fn, temperature, keep=keep)

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


def test_padding_rows_stay_out_of_the_loss(tmp_path):
    """The trainer leaves the rows dynamic sampling marks as padding (a rank one group short)
    out of the loss mask and of its token count. One rank never pads, so the test marks the
    step's first group as padding itself."""
    trainer = _trainer(tmp_path, 1, 3)
    real_sample, real_loss = trainer._sample, trainer.policy_update.loss_fn
    seen = {"masks": [], "counts": []}

    def sample(timer):
        sampled = real_sample(timer)
        sampled.padding[: trainer.cfg.rl.group_size] = True
        seen["batch"] = sampled.train.rollout.batch
        return sampled

    def loss_fn(*args, **kwargs):
        seen["masks"].append(args[4])
        seen["counts"].append(args[5])
        return real_loss(*args, **kwargs)

    trainer._sample, trainer.policy_update.loss_fn = sample, loss_fn
    trainer.fit()
    group = trainer.cfg.rl.group_size
    completion = seen["batch"].completion_mask
    assert completion[:group].any()  # the padding rows drew tokens...
    mask = torch.cat(seen["masks"])
    assert not mask[:group].any()  # ... that the loss never sees
    assert torch.equal(mask[group:], completion[group:])
    assert set(seen["counts"]) == {float(completion[group:].sum())}


# ---- two ranks ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[dict, dict]:
    """Each rank's results of every case of scripted_rounds.TWO_RANK_CASES, from one spawn."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("two_ranks")
    mp.spawn(two_rank_worker, args=(str(out / "init"), str(out)), nprocs=2)
    return tuple(json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))


def test_two_ranks_pool_their_signal_groups(two_ranks):
    """Together the ranks hold 4 groups with signal after 2 rounds (rank 0 three, rank 1 one):
    both stop there, and rank 0 hands its third (round 2's) to rank 1 instead of dropping it,
    so that each trains 2 and all 4 are trained, as DAPO's pooled batch would. Before, both
    drew until the limit (3 rounds) and trained 1 group each."""
    r0, r1 = (rank["pooled"] for rank in two_ranks)
    assert r0["draws"] == r1["draws"] == 2
    assert r0["train"] == ["r0x0-0", "r0x0-1"] and r1["train"] == ["r1x1-0", "r0x1-1"]
    assert r1["texts"] == ["r1x1-0/0", "r1x1-0/1", "r0x1-1/0", "r0x1-1/1"]
    assert r1["scores"] == [1.0, 0.0, 1.0, 0.0]
    assert r1["logit_rows"] == [True, True, False, False]  # its logits stayed on rank 0
    assert r0["padding"] == r1["padding"] == [False] * 4
    assert (
        r0["metrics"]
        == r1["metrics"]
        == {
            "sampling/groups_drawn": 8.0,
            "sampling/groups_kept": 4.0,
            "sampling/groups_dropped": 4.0,
            "sampling/rounds": 2.0,
            "sampling/round_limit_hit": 0.0,
        }
    )


def test_a_rank_that_draws_no_signal_trains_another_ranks_groups(two_ranks):
    """Rank 1 never draws a group with signal; rank 0 draws three by the round limit. Before,
    both trained the smallest count kept, 0 (the last round, all advantages 0): rank 0's three
    groups were lost. Now rank 0 trains two, rank 1 the third, plus one of its own groups as
    padding (out of the loss) so that both hold 2 groups."""
    r0, r1 = (rank["one_rank_none"] for rank in two_ranks)
    assert r0["draws"] == r1["draws"] == 2
    assert r0["train"] == ["r0x0-0", "r0x1-0"]
    assert r1["train"] == ["r0x1-1", "r1x0-0"]  # rank 0's group, then its own padding
    assert r0["padding"] == [False] * 4 and r1["padding"] == [False, False, True, True]
    assert r0["metrics"] == r1["metrics"]
    assert r0["metrics"]["sampling/groups_kept"] == 3.0
    assert r0["metrics"]["sampling/round_limit_hit"] == 1.0
