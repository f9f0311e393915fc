"""A checkpoint directory with a missing or corrupt file is skipped with a warning naming the file.

The manager-level cases for small files, size changes and markers are in tests/rl/
test_checkpoint.py; here: a same-size corruption of a large file (the actor's weights and
optimizer state live in one file over the sha256 threshold), and the real `sparrow-train`
resuming past a damaged newest checkpoint to the one before it.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.train.run.checkpoint import CHECKSUM_MAX_BYTES, MARKER, CheckpointManager

ROOT = Path(__file__).resolve().parents[3]
# A fresh single-process run: no rendezvous variables left by in-process tests.
_DIST = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
ENV = {k: v for k, v in os.environ.items() if k not in _DIST}
ENV |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
COMMON = ["preset=tiny", "rl.steps=2", "rl.save_every=1", "rl.keep_last=3", "rl.eval.every=0"]
ACTOR_FILE = "actor/deepspeed/mp_rank_00_model_states.pt"  # ZeRO-0: weights + optimizer


def _flip_byte(file: Path, offset: int) -> None:
    data = bytearray(file.read_bytes())
    data[offset] ^= 0x01
    file.write_bytes(bytes(data))


def _big_actor_save(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "weights.bin").write_bytes(os.urandom(CHECKSUM_MAX_BYTES + 4096))


@pytest.mark.parametrize("offset", [0, CHECKSUM_MAX_BYTES // 2, -1])
def test_same_size_corruption_of_a_large_file_is_caught(tmp_path, caplog, offset):
    manager = CheckpointManager(tmp_path, keep_last=3)
    first = manager.save(1, {"position": 1}, save_actor=_big_actor_save)
    newest = manager.save(2, {"position": 2}, save_actor=_big_actor_save)
    assert "crc32" in json.loads((newest / MARKER).read_text())["files"]["actor/weights.bin"]
    _flip_byte(newest / "actor/weights.bin", offset)
    with caplog.at_level(logging.WARNING, logger="sparrow.train.run.checkpoint"):
        assert manager.latest_complete() == first
    assert f"{newest / 'actor/weights.bin'} fails its CRC-32 check" in caplog.text


def _train(run_dir: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "sparrow.cli.train", *COMMON, f"run_dir={run_dir}"]
    return subprocess.run(
        cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=HANG_GUARD_S
    )


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda p: (p / ACTOR_FILE).unlink(), "missing file {file}"),
        (lambda p: _flip_byte(p / ACTOR_FILE, 1000), "{file} fails its CRC-32 check"),
        (lambda p: _flip_byte(p / "trainer_state.pt", 100), "{file} fails its sha256 check"),
    ],
    ids=["missing", "corrupt-actor", "corrupt-state"],
)
def test_train_resumes_past_a_damaged_checkpoint(tmp_path_factory, tmp_path, damage, problem):
    base = tmp_path_factory.getbasetemp() / "damaged_base"
    if not base.exists():  # one uninterrupted 2-step run shared by the cases
        out = _train(base)
        assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "run"
    shutil.copytree(base, run)
    newest = run / "checkpoints" / "step_000002"
    damage(newest)
    file = newest / "trainer_state.pt" if "sha256" in problem else newest / ACTOR_FILE

    out = _train(run)
    assert out.returncode == 0, out.stderr[-3000:]
    warning = f"skipping checkpoint {newest}: {problem.format(file=file)}"
    assert warning in out.stderr
    assert f"resumed from {run / 'checkpoints' / 'step_000001'} at step 1" in out.stdout
    # Step 2 was redone from step 1 and logged again, with the original run's numbers.
    redone, original = _rows(run)[-1], _rows(base)[-1]
    assert redone["step"] == original["step"] == 2
    assert redone["loss/loss"] == original["loss/loss"]
    assert redone["reward/mean"] == original["reward/mean"]
