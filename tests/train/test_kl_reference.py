"""rl.loss.kl_coef > 0 through the loop (FakeActor, tiny model): the reference is the initial
weights, so the KL is 0 at step 1 (policy = reference) and > 0 after the first update, equal to
k3 by hand from an independent forward of the initial model. And the user's command: the smoke
preset (its `length` reward gives the random model signal) with kl_coef 0.05 through the CLI."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hang_guard import HANG_GUARD_S
from test_loop_fake_actor import _trainer


def test_kl_to_the_initial_weights(tmp_path):
    trainer = _trainer(tmp_path, "rl.steps=2", "rl.loss.kl_coef=0.05", "rl.skip_no_signal=false")
    initial = copy.deepcopy(trainer.actor.model).eval()
    seen = []
    real_train_step = trainer.actor.train_step

    def train_step(micro_batches, loss_fn, temperature, keep=None):
        out = real_train_step(micro_batches, loss_fn, temperature, keep=keep)
        # rl.dense_pass=update: the old log-probs are the forward's own, kept per micro-batch.
        seen.append([(mb, part[0]) for mb, part in zip(micro_batches, keep.parts, strict=True)])
        return out

    trainer.actor.train_step = train_step
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["update/kl_ref"] == 0.0  # bit-equal log-probs before any update
    assert rows[1]["update/kl_ref"] > 0.0
    # Step 2 by hand: k3 = e^d - d - 1, d = log p_ref - log p, over the completion tokens, with
    # p the policy before step 2's update (the old log-probs) and p_ref the initial model.
    num, den = 0.0, 0.0
    with torch.no_grad():
        for mb, old in seen[1]:
            logits = initial(mb["input_ids"], attention_mask=mb["attention_mask"]).logits
            ref = logits[:, :-1].float().log_softmax(-1)
            ref = ref.gather(-1, mb["input_ids"][:, 1:, None])[..., 0]  # (b, T - 1)
            mask = mb["completion_mask"][:, 1:]
            d = (ref - old[:, 1:])[mask].double()
            num += float((d.exp() - d - 1).sum())
            den += float(mask.sum())
    assert rows[1]["update/kl_ref"] == pytest.approx(num / den, rel=1e-3, abs=1e-7)


def test_smoke_preset_with_kl_logs_a_growing_kl(tmp_path):
    """`sparrow-train preset=smoke rl.loss.kl_coef=0.05` (DeepSpeed actor): 0 at step 1, where
    the policy is the reference, and > 0 at step 2, after step 1's update moved theta."""
    cmd = [sys.executable, "-m", "sparrow.cli.train", "preset=smoke", "rl.loss.kl_coef=0.05"]
    cmd += [f"run_dir={tmp_path}", "logger=disabled"]
    root = Path(__file__).resolve().parents[2]
    # Not this process's rendezvous: an in-process actor of an earlier test set these (and holds
    # MASTER_PORT), and a launch that inherits them would join that port.
    dist = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in dist} | {"OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        cmd, cwd=root, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    kl = {r["step"]: r["update/kl_ref"] for r in rows if "update/kl_ref" in r}
    assert kl[1] == 0.0 and kl[2] > 0.0, kl
    assert all(r["reward/mean"] > 0 for r in rows if "reward/mean" in r)  # signal: it trained
