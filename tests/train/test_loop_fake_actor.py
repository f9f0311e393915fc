"""The whole GRPO loop (rollout, rewards, advantages, log-probs, acceptance, controller, update,
weight sync, logging, checkpoint) on a tiny random model with the plain-torch FakeActor (a few
seconds), and no DeepSpeed (the loop test passes in an interpreter where `import deepspeed`
fails). And the FakeActor against the real DenseActor on one batch, so that what the loop test
shows holds for the actor the trainer really uses."""

import copy
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
from fake_actor import FakeActor
from hang_guard import HANG_GUARD_S

from sparrow.cli.config_loader import load_config
from sparrow.tasks.rewards import GuardedReward
from sparrow.train.trainer import GRPOTrainer

ROOT = Path(__file__).resolve().parents[2]
# 4-token pages and a 3-page budget: the ~30-token prompts decode sparsely from the first step.
OVERRIDES = [
    "preset=tiny",
    "rl.eval.every=0",
    "rl.prompts_per_step=2",
    "rl.group_size=4",
    "rollout.max_new_tokens=8",
    "rollout.engine.page_size=4",
    "schedule.mode=fixed",
    "schedule.budgets_pages=[3]",
    "actor.lr=1e-3",
]


def _parity(prompt: str, completion: str, reference: str) -> float:
    """A reward that varies within a group on a random model, so that advantages are nonzero."""
    return float(zlib.crc32(completion.encode()) % 2)


def _trainer(run_dir, *extra: str) -> GRPOTrainer:
    cfg = load_config([*OVERRIDES, *extra, f"run_dir={run_dir}"])
    trainer = GRPOTrainer.from_config(cfg, make_actor=FakeActor)
    trainer.draw.reward = GuardedReward(_parity, "parity")
    return trainer


def _hand_loss(micro_batches) -> float:
    """The GRPO/TIS loss of the step's first forward: the update's log-probs are the old ones
    (same weights), so the ratio is 1 and the clipped surrogate is -A per token, times the TIS
    weight min(exp(old - rollout), 2), summed over completion tokens / their count."""
    num, den = 0.0, 0.0
    for mb in micro_batches:
        mask = mb["completion_mask"]
        weight = torch.exp(mb["old_logprobs"] - mb["rollout_logprobs"]).clamp(max=2.0)
        num += float((-mb["advantages"] * weight)[mask].sum())
        den += float(mask.sum())
    return num / den


def test_two_steps_with_fake_actor(tmp_path):
    trainer = _trainer(tmp_path, "distill=default")  # with the DistillSparse phase
    before = copy.deepcopy(trainer.actor.gathered_state_dict())
    seen, gathers = [], []
    real_train_step, real_gather = trainer.actor.train_step, trainer.actor.gathered_state_dict
    trainer.actor.gathered_state_dict = lambda: gathers.append(1) or real_gather()

    def recording_train_step(micro_batches, loss_fn, temperature, keep=None):
        out = real_train_step(micro_batches, loss_fn, temperature, keep=keep)
        # One dense forward (rl.dense_pass=update): the old log-probs are the forward's own.
        for mb, part in zip(micro_batches, keep.parts, strict=True):
            mb["old_logprobs"] = part[0]
        seen.append((micro_batches, out))
        return out

    trainer.actor.train_step = recording_train_step
    trainer.fit()

    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in ("reward/mean", "loss/loss", "update/grad_norm", "accept/p5_min"):
            assert isinstance(row[key], float), key
        phases = ("rollout", "rewards", "monitor", "control", "update", "distill")
        for phase in (*phases, "sync", "step"):
            assert row[f"time/{phase}_s"] >= 0.0
        assert "time/logprobs_s" not in row  # the update's forward gave the dense log-probs
        assert 0.0 < row["kv_read_ratio"] < 1.0  # the 3-page budget read fewer pages than dense
        assert row["schedule/budget_pages/bin0"] == 3
        assert isinstance(row["distill/grad_norm"], float)

    # The advantages were not all zero, the logged loss is the hand-computed one, and theta moved.
    assert any(float(mb["advantages"].abs().sum()) > 0 for mb in seen[0][0])
    for (micro_batches, out), row in zip(seen, rows, strict=True):
        assert row["loss/loss"] == pytest.approx(_hand_loss(micro_batches), rel=1e-5, abs=1e-7)
        assert row["loss/loss"] == pytest.approx(out["loss"])
        # The rollout correction's statistics, reduced over the micro-batches as over the batch.
        ratios = torch.cat(
            [
                (mb["old_logprobs"] - mb["rollout_logprobs"])[mb["completion_mask"]].exp()
                for mb in micro_batches
            ]
        )
        assert row["correction/truncated_frac"] == pytest.approx(float((ratios > 2).float().mean()))
        assert row["correction/weight_max"] == pytest.approx(float(ratios.clamp(max=2).max()))
        assert row["correction/masked_frac"] == 0.0
    # theta is gathered once per step, for the adapter's base and the engine alike.
    assert len(gathers) == 2
    after = real_gather()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # ... and the engine rolls out with the updated weights (the weight sync ran).
    name = "model.layers.0.self_attn.q_proj.weight"
    engine_weight = trainer.engine.runner.model._parameter_views()[name]
    assert torch.equal(engine_weight, after[name].to(engine_weight.dtype))
    assert (tmp_path / "checkpoints" / "step_000002" / "COMPLETE").is_file()


def test_the_loop_needs_no_deepspeed():
    """The loop test in a fresh interpreter where importing deepspeed fails (None in
    sys.modules): the trainer, the monitor and the FakeActor import none of it."""
    code = (
        "import sys; sys.modules['deepspeed'] = None; import pytest; sys.exit(pytest.main(["
        f"'-q', '-s', '-p', 'no:cacheprovider', {__file__!r}, '-k', 'two_steps']))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout


def test_fake_actor_matches_dense_actor(tmp_path):
    """Same model, same micro-batches, same loss: same loss, gradient norm and updated weights."""
    from sparrow.rl.actor import DenseActor

    trainer = _trainer(tmp_path)
    captured = {}
    real_train_step = trainer.actor.train_step
    model0 = copy.deepcopy(trainer.actor.model)

    def capture(micro_batches, loss_fn, temperature, keep=None):
        captured.update(mbs=micro_batches, loss_fn=loss_fn, temperature=temperature)
        return real_train_step(micro_batches, loss_fn, temperature, keep=keep)

    trainer.actor.train_step = capture
    fake = trainer.train_step()
    cfg = trainer.cfg.actor
    dense = DenseActor(model0, cfg)
    out = dense.train_step(captured["mbs"], captured["loss_fn"], captured["temperature"])
    assert out["loss"] == pytest.approx(fake["loss/loss"], rel=1e-5)
    assert out["grad_norm"] == pytest.approx(fake["update/grad_norm"], rel=1e-4)
    theta_fake, theta_dense = trainer.actor.gathered_state_dict(), dense.gathered_state_dict()
    for k in theta_fake:
        torch.testing.assert_close(theta_dense[k], theta_fake[k], rtol=1e-4, atol=1e-6)
