"""CheckpointManager: atomic layout, verification, keep-last-N, RNG, SIGKILL, actor round trip."""

import json
import logging
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hang_guard import HANG_GUARD_S
from tiny_lm import pg_loss_fn, rl_batch, tiny_causal_lm

from sparrow.rl.actor import DenseActor
from sparrow.rl.actor_config import ActorConfig
from sparrow.rl.micro_batches import split_micro_batches
from sparrow.train.run.checkpoint import MARKER, CheckpointManager

STATE = {"data_position": 17, "controller": {"budgets": [4, 8]}, "metrics": {"reward": 0.5}}


def fake_actor_save(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "weights.bin").write_bytes(bytes(range(256)) * 8)


def test_save_layout_marker_and_load(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    path = manager.save(3, {**STATE, "lora": {"a": torch.ones(2)}}, save_actor=fake_actor_save)
    assert path == tmp_path / "step_000003" and not list(tmp_path.glob("*.tmp"))
    files = json.loads((path / MARKER).read_text())["files"]
    assert set(files) == {
        "actor/weights.bin",
        "trainer_state.pt",
        "trainer_state.json",
        "rng_rank0.pt",
    }
    assert files["actor/weights.bin"]["bytes"] == 2048 and "sha256" in files["actor/weights.bin"]
    assert json.loads((path / "trainer_state.json").read_text())["data_position"] == 17
    assert manager.latest_complete() == path
    loaded = manager.load(path)
    assert loaded.step == 3 and loaded.actor_dir == path / "actor"
    assert loaded.state["controller"] == STATE["controller"]
    assert torch.equal(loaded.state["lora"]["a"], torch.ones(2))


def test_rng_states_are_restored(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=1)
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    path = manager.save(1, STATE)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    manager.load(path)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_keep_last_n_prunes_oldest(tmp_path):
    manager = CheckpointManager(tmp_path, keep_last=2)
    for step in range(1, 5):
        manager.save(step, STATE, save_actor=fake_actor_save)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000003", "step_000004"]


@pytest.mark.parametrize(
    "damage, named",
    [
        (lambda p: (p / "actor/weights.bin").write_bytes(b"x" * 2048), "actor/weights.bin"),
        (lambda p: (p / "actor/weights.bin").write_bytes(b"short"), "actor/weights.bin"),
        (lambda p: (p / "rng_rank0.pt").unlink(), "rng_rank0.pt"),
        (lambda p: (p / MARKER).unlink(), MARKER),
        (lambda p: (p / MARKER).write_text("{trunc"), MARKER),
    ],
    ids=["checksum", "size", "missing", "no-marker", "bad-marker"],
)
def test_latest_complete_skips_damaged_checkpoint(tmp_path, caplog, damage, named):
    manager = CheckpointManager(tmp_path, keep_last=3)
    manager.save(1, STATE, save_actor=fake_actor_save)
    newest = manager.save(2, STATE, save_actor=fake_actor_save)
    damage(newest)
    with caplog.at_level(logging.WARNING, logger="sparrow.train.run.checkpoint"):
        assert manager.latest_complete() == tmp_path / "step_000001"
    assert str(newest / named) in caplog.text


def test_leftover_tmp_is_ignored_and_cleaned(tmp_path):
    CheckpointManager(tmp_path, keep_last=2).save(1, STATE)
    (tmp_path / "step_000002.tmp").mkdir()
    (tmp_path / "step_000002.tmp" / MARKER).write_text("{}")
    manager = CheckpointManager(tmp_path, keep_last=2)
    assert not (tmp_path / "step_000002.tmp").exists()
    assert manager.latest_complete() == tmp_path / "step_000001"
    assert CheckpointManager(tmp_path / "empty", keep_last=1).latest_complete() is None


# Saves step 2 and hangs (to be SIGKILLed) inside the actor write or just before the rename.
WRITER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from sparrow.train.run.checkpoint import CheckpointManager

    root, where = Path(sys.argv[1]), sys.argv[2]

    def hang():
        print("WRITING", flush=True)
        time.sleep(120)

    def slow_actor_save(directory):
        directory.mkdir(parents=True)
        with open(directory / "weights.bin", "wb") as f:
            f.write(b"w" * 4096)
            if where == "actor":
                hang()

    if where == "rename":  # the COMPLETE marker is written, the rename has not happened
        real_replace = os.replace
        os.replace = lambda src, dst: (hang(), real_replace(src, dst))
    CheckpointManager(root, keep_last=2).save(2, {"data_position": 2}, slow_actor_save)
    """
)


@pytest.mark.parametrize("where", ["actor", "rename"])
def test_sigkill_during_write_keeps_previous_checkpoint(tmp_path, where):
    manager = CheckpointManager(tmp_path, keep_last=2)
    previous = manager.save(1, STATE, save_actor=fake_actor_save)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path), where],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout.readline().strip() == "WRITING"
        writer.kill()  # SIGKILL mid-write
        writer.wait(timeout=HANG_GUARD_S)
    finally:
        writer.kill()
    assert (tmp_path / "step_000002.tmp").exists()
    if where == "rename":
        assert (tmp_path / "step_000002.tmp" / MARKER).exists()
    assert CheckpointManager(tmp_path, keep_last=2).latest_complete() == previous
    assert not (tmp_path / "step_000002.tmp").exists()


def test_zero3_actor_round_trip_continues_with_identical_losses(tmp_path):
    """Single rank: the multi-rank version lives in test_distributed.py."""
    cfg = ActorConfig(zero_stage=3, lr=1e-3, micro_batch_size=2, warmup_steps=3, precision="fp32")
    batches = [rl_batch(4, 12, seed=20 + s) for s in range(4)]

    def step(actor, s):
        loss_fn = pg_loss_fn(int(batches[s]["completion_mask"].sum()))
        return actor.train_step(split_micro_batches(batches[s], 2), loss_fn)

    actor = DenseActor(tiny_causal_lm("qwen3", seed=0), cfg)
    manager = CheckpointManager(tmp_path, keep_last=1)
    for s in range(2):
        step(actor, s)
    manager.save(2, {"data_position": 2}, save_actor=actor.save_checkpoint)
    continued = [step(actor, s) for s in (2, 3)]

    resumed_actor = DenseActor(tiny_causal_lm("qwen3", seed=1), cfg)
    loaded = manager.load(manager.latest_complete())
    resumed_actor.load_checkpoint(loaded.actor_dir)
    resumed = [step(resumed_actor, s) for s in range(loaded.state["data_position"], 4)]
    assert [m["loss"] for m in resumed] == [m["loss"] for m in continued]
    assert [m["lr"] for m in resumed] == [m["lr"] for m in continued]  # schedule restored too
