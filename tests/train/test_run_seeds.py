"""One seed for every random stream (sparrow/train/run/seeds.py): the derivation itself; `seed`
moving the sampling and the prompt order of a real trainer; an explicit component seed winning
(and the plan line saying so); and the same seed giving the same run, weights and metrics."""

import json
from dataclasses import asdict, replace

import torch
from fake_actor import FakeActor
from safetensors.torch import load_file

from sparrow.cli.config_loader import load_config
from sparrow.train.config import SparrowConfig
from sparrow.train.run.seeds import resolve_seeds, stream_seed
from sparrow.train.run.stored_config import differing_keys
from sparrow.train.trainer import GRPOTrainer

TINY = ["preset=tiny", "rl.eval.every=0"]


def test_stream_seeds_are_stable_and_unrelated():
    seeds = {
        (seed, stream, rank): stream_seed(seed, stream, rank)
        for seed in (0, 1, 2)
        for stream in ("sampling", "data_order", "eval")
        for rank in (0, 1)
    }
    assert len(set(seeds.values())) == len(seeds)  # no two streams share a seed
    assert all(0 <= s < 2**31 for s in seeds.values())
    assert stream_seed(0, "sampling", 0) == seeds[(0, "sampling", 0)]  # a pure function
    # seed + 1 is not seed's stream shifted by one call (the engine adds the call index)
    assert abs(stream_seed(1, "sampling") - stream_seed(0, "sampling")) > 10**6


def test_an_explicit_component_seed_wins_and_is_named():
    derived = resolve_seeds(3, None, True, None, rank=1)
    assert derived.sampling == stream_seed(3, "sampling", 1)
    assert derived.data_order == stream_seed(3, "data_order")  # one order for all ranks
    assert derived.describe() == "seed 3 derives every random stream"
    explicit = resolve_seeds(3, 7, True, 11, rank=0)
    assert (explicit.sampling, explicit.data_order) == (7, 11)
    assert explicit.describe() == (
        "seed 3 derives every random stream but rollout.engine.seed=7, data.shuffle_seed=11 "
        "(set explicitly, wins)"
    )
    assert resolve_seeds(3, None, False, 11, rank=0).data_order is None  # source order


def test_a_resume_with_another_seed_is_a_changed_run():
    base = SparrowConfig()
    engine = replace(base.rollout.engine, seed=5)
    other = replace(base, seed=1, rollout=replace(base.rollout, engine=engine))
    assert differing_keys(asdict(base), asdict(other)) == [
        "rollout.engine.seed: None -> 5",
        "seed: 0 -> 1",
    ]


def _first_rollout(run_dir, *overrides):
    """The trainer's plan and its step-1 rollout: (prompt ids, completion ids) per sample."""
    trainer = GRPOTrainer.from_config(
        load_config([*TINY, *overrides, f"run_dir={run_dir}"]), FakeActor
    )
    prompts = next(trainer.prompts)
    outputs = trainer.draw.rollout(prompts).outputs
    ids = [(prompts[o.prompt_index].token_ids, o.token_ids) for o in outputs]
    return trainer.plan(), ids


def test_seed_moves_sampling_and_prompt_order_unless_set_explicitly(tmp_path):
    _, base = _first_rollout(tmp_path / "a", "seed=0")
    _, other = _first_rollout(tmp_path / "b", "seed=1")
    assert [p for p, _ in other] != [p for p, _ in base]  # another prompt order
    # The same prompts (the shuffle pinned to seed 0's), another sampling stream.
    order = f"data.shuffle_seed={stream_seed(0, 'data_order')}"
    _, resampled = _first_rollout(tmp_path / "c", "seed=1", order)
    assert [p for p, _ in resampled] == [p for p, _ in base]
    assert [c for _, c in resampled] != [c for _, c in base]
    # An explicit engine seed wins over seed=1: seed 0's samples again, and the plan says so.
    engine = f"rollout.engine.seed={stream_seed(0, 'sampling', 0)}"
    plan, pinned = _first_rollout(tmp_path / "d", "seed=1", order, engine)
    assert pinned == base
    assert f"seed 1 derives every random stream but {engine}, {order} (set explicitly" in plan


def _timing(key: str) -> bool:
    return key.startswith(("time/", "memory/")) or "tok_s" in key or key == "speedup/measured"


def _metrics(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not _timing(k)} for r in rows]


def test_the_same_seed_gives_the_same_run(tmp_path):
    """Two whole runs (the real DeepSpeed actor, evaluation on) with seed=0: the same exported
    weights, the same metrics but for timings."""
    for name in ("a", "b"):
        overrides = ["preset=tiny", "seed=0", f"run_dir={tmp_path / name}"]
        GRPOTrainer.from_config(load_config(overrides)).fit()
    weights = [load_file(tmp_path / n / "policy" / "model.safetensors") for n in ("a", "b")]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    rows = [_metrics(tmp_path / n) for n in ("a", "b")]
    assert [r["step"] for r in rows[0]] == [0, 1, 2]
    assert rows[0] == rows[1]


def _streams(seeds, step: int) -> dict[str, int]:
    return {
        "sampling": seeds.sampling,
        "data_order": seeds.data_order,
        "global": seeds.global_rngs,
        "distill_init": seeds.distill_init,
        "distill_dropout": seeds.distill_dropout,
        "eval": seeds.eval(step),
        "speedup": seeds.speedup(step),
    }


def test_every_stream_is_derived_from_seed():
    """Each stream of RunSeeds as the module docstring derives it from (seed, stream, rank), plus
    the step for evaluation and the speedup probe: so each moves with `seed`, and none is
    seeded from the step or the rank alone."""
    for rank in (0, 1):
        for step in (0, 7):
            by_seed = {}
            for seed in (0, 1, 2):
                derived = _streams(resolve_seeds(seed, None, True, None, rank), step)
                assert derived == {
                    "sampling": stream_seed(seed, "sampling", rank),
                    "data_order": stream_seed(seed, "data_order"),  # one order for all ranks
                    "global": stream_seed(seed, "global"),
                    "distill_init": stream_seed(seed, "distill_init"),  # every rank alike
                    "distill_dropout": stream_seed(seed, "distill_dropout", rank),
                    "eval": stream_seed(seed, "eval", rank) + step,
                    "speedup": stream_seed(seed, "speedup", rank) + step,
                }
                by_seed[seed] = derived
            for stream in by_seed[0]:
                values = {by_seed[seed][stream] for seed in by_seed}
                assert len(values) == len(by_seed), f"{stream} does not move with seed"


def test_evaluation_samples_from_the_eval_stream(tmp_path):
    """The trainer's evaluation at step 3 asks the engine for seed 5's eval stream + 3."""
    trainer = GRPOTrainer.from_config(
        load_config([*TINY, "seed=5", "rl.eval.num_prompts=2", f"run_dir={tmp_path}"]), FakeActor
    )
    seeds, real_generate = [], trainer.engine.generate

    def generate(*args, **kwargs):
        seeds.append(kwargs.get("seed"))
        return real_generate(*args, **kwargs)

    trainer.engine.generate, trainer.step = generate, 3
    trainer._evaluate()
    assert seeds == [stream_seed(5, "eval", 0) + 3]
