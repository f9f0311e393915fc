"""The asynchronous loop (rl.async.staleness=1) on a tiny random model with the plain-torch
FakeActor: step t+1's rows are sampled by the weights before update t (one version behind, logged
as async/staleness), the monitor measures them against the dense policy of those same weights,
and two runs give the same metrics and weights (the producer's thread shares no random state).

The monitor's rule is tested where it matters: a rollout that is stale but DENSE (schedule=dense,
so the sparse policy IS the dense one) must measure acceptance 1, not the update's drift; the
naive path, the trainer's newer dense policy against those rows, measures the drift (< 1). And
under a sparse schedule the asynchronous monitor's first step reads, bin by bin, the acceptance
the synchronous run measures (its dense side really dense, not the sparse policy against itself)."""

import json
import math

import pytest
import torch
from fake_actor import FakeActor
from test_loop_fake_actor import OVERRIDES, _parity

import sparrow.train.rollouts.draw as draw_module
from sparrow.cli.config_loader import load_config
from sparrow.monitor.exact_acceptance import exact_batch_acceptance
from sparrow.tasks.rewards import GuardedReward
from sparrow.train.trainer import GRPOTrainer

ASYNC = ["rl.async.staleness=1", "rl.steps=3", "actor.lr=3e-2", "rl.skip_no_signal=false"]


def _trainer(run_dir, *extra: str) -> GRPOTrainer:
    cfg = load_config([*OVERRIDES, *ASYNC, *extra, f"run_dir={run_dir}"])
    trainer = GRPOTrainer.from_config(cfg, make_actor=FakeActor)
    trainer.draw.reward = GuardedReward(_parity, "parity")
    return trainer


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_stale_dense_rollout_measures_acceptance_one_not_the_drift(tmp_path, monkeypatch):
    trainer = _trainer(tmp_path, "schedule.mode=dense")
    kept = {}  # step -> the monitored rows with their kept rollout logits, before they are freed
    real_same_weights = draw_module.same_weights_dense

    def keeping(engine, batch, plan, *args):
        rows = torch.arange(len(batch))[torch.tensor(plan.logit_rows)]
        sub = batch.select(rows)
        sub.rollout_logits = [x.clone() for x in sub.rollout_logits]
        kept[int(batch.weight_version[0])] = sub
        return real_same_weights(engine, batch, plan, *args)

    monkeypatch.setattr(draw_module, "same_weights_dense", keeping)
    naive = {}
    real_measure = trainer.monitor.measure_same_weights

    def measure(step, prompt_ids, batch, *args):
        if step == 1:  # rows of version 0, the actor already updated once
            version = int(batch.weight_version[0])
            # What a monitor comparing with the trainer's dense policy would measure.
            naive[version] = exact_batch_acceptance(
                trainer.engine, trainer.actor.model, kept[version], 1.0, 8
            )[kept[version].completion_mask]
        return real_measure(step, prompt_ids, batch, *args)

    trainer.monitor.measure_same_weights = measure
    trainer.fit()

    rows = _rows(tmp_path)
    assert [r["async/staleness"] for r in rows] == [0.0, 1.0, 1.0]  # step 1 from the start
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]
    for row in rows:  # sparse == dense and the same weights: acceptance 1 to float tolerance
        assert row["accept/p5_min"] > 1 - 1e-4, row["accept/p5_min"]
        assert row["accept/mean"] > 1 - 1e-5
    drift = naive[0]  # the stale rows against the updated policy: the update's drift
    assert float(torch.quantile(drift, 0.05)) < 0.99  # measured 0.80 (same weights: 0.9999998)
    assert float(drift.mean()) < 0.99


def _first_step(run_dir, *extra: str) -> dict:
    """Step 1's metrics of a one-step run of OVERRIDES' sparse schedule (schedule.mode=fixed,
    the default mode: the tiny preset's default budgets would hold every page of these short
    rows, so its 3 pages of 4 tokens decode sparsely instead)."""
    cfg = load_config([*OVERRIDES, "rl.steps=1", *extra, f"run_dir={run_dir}"])
    trainer = GRPOTrainer.from_config(cfg, make_actor=FakeActor)
    trainer.draw.reward = GuardedReward(_parity, "parity")
    trainer.fit()
    (row,) = _rows(run_dir)
    return row


def test_async_acceptance_under_a_sparse_schedule_equals_the_synchronous_runs(tmp_path):
    """The asynchronous monitor scores its rows' dense side on the engine, densely, with the
    weights that sampled them; at step 1 those are the synchronous run's weights and rows, so
    every bin reads the acceptance the synchronous run's actor pass measures (measured: equal to
    1.5e-7). A dense side scored under the sparse schedule would read exactly 1."""
    sync = _first_step(tmp_path / "sync")
    stale = _first_step(tmp_path / "async", "rl.async.staleness=1")
    assert stale["async/staleness"] == 0.0  # step 1: drawn on the initial weights
    per_bin = [k for k in sync if k.startswith("accept/") and "/bin" in k]
    assert {k.split("/")[-1] for k in per_bin} == {"bin0", "bin1"}, per_bin
    assert all(sync[k] == stale[k] for k in per_bin if k.startswith("accept/count/"))
    for key in per_bin:
        assert stale[key] == pytest.approx(sync[key], abs=1e-5), (key, stale[key], sync[key])
    # Sparse is not dense here: a monitor comparing the sparse policy with itself would not
    # tell the two runs apart.
    for run in (sync, stale):
        assert run["accept/p5_min"] < 0.999 and run["accept/mean"] < 0.999, run["accept/mean"]


def test_two_async_runs_are_the_same_run(tmp_path):
    """Timing aside, every metric and every weight of two runs agree: the producer's thread
    samples from the engine's own stream, in the same order, whatever the threads' timing."""
    weights = []
    for name in ("a", "b"):
        trainer = _trainer(tmp_path / name)
        trainer.fit()
        weights.append(trainer.actor.gathered_state_dict())
    a, b = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    timing = ("time/", "throughput/", "async/rollout_s", "async/rewards_s", "async/same_weights_s")
    timing += ("async/draw_s", "rollout/decode_tok_s", "rollout/prefill_tok_s", "memory/")
    for ra, rb in zip(a, b, strict=True):
        keys = [k for k in ra if not k.startswith(timing) and "tok_s" not in k]
        assert keys and set(keys) <= set(rb)
        for key in keys:
            same = ra[key] == rb[key] or (
                isinstance(ra[key], float) and math.isnan(ra[key]) and math.isnan(rb[key])
            )
            assert same, (ra["step"], key, ra[key], rb[key])
    assert a[1]["async/staleness"] == 1.0 and a[1]["correction/weight_max"] != 1.0
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name


def test_a_merged_adapter_is_refused(tmp_path):
    """With phi merged into the engine's weights its dense decode is theta + phi, so the
    same-weights replay would not be the dense policy: refused (the gated adapter is fine)."""
    with pytest.raises(ValueError, match="needs distill.gate=true"):
        _trainer(tmp_path, "distill=default", "distill.gate=false")
