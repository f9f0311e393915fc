"""Kill-and-resume of a LoRA RL run (actor.lora.rank=8) is exact: a SIGKILL inside step 3's update
(gradients half accumulated), then resume=auto, gives the uninterrupted run's every step (loss,
reward, gradient norm, tokens, the bytes synced to the engine) and its exported adapter and merged
weights byte for byte: the adapter and its AdamW state come back from the checkpoint and reach the
engine before the resumed run's first rollout (else its rollouts, hence rewards, would differ)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]
PAUSE_AT = Path(__file__).with_name("pause_at.py")
LORA = [
    "preset=tiny",
    "actor.lora.rank=8",
    "actor.lr=1e-2",
    "rl.steps=4",
    "rl.save_every=1",
    "rl.eval.every=0",
    "rl.reward.name=test_length",  # scores vary within groups: the adapter really moves
]
_DIST = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
ENV = {k: v for k, v in os.environ.items() if k not in _DIST} | {"HF_HUB_OFFLINE": "1"}


def _launch(phase: str, step: int, run_dir: Path, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, str(PAUSE_AT), phase, str(step), str(log.with_suffix(".paused"))]
    with open(log.with_suffix(".out"), "w") as out, open(log.with_suffix(".err"), "w") as err:
        return subprocess.Popen(
            [*cmd, *LORA, f"run_dir={run_dir}"],
            cwd=ROOT,
            env=ENV,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )


def _rows(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows}


@pytest.mark.slow
def test_sigkill_in_the_update_of_a_lora_run_resumes_exactly(tmp_path):
    straight = tmp_path / "straight"
    proc = _launch("none", 0, straight, tmp_path / "straight")
    assert proc.wait(timeout=HANG_GUARD_S) == 0, (tmp_path / "straight.err").read_text()[-3000:]

    killed, log = tmp_path / "killed", tmp_path / "kill"
    proc = _launch("update", 3, killed, log)
    deadline = time.monotonic() + HANG_GUARD_S
    while not log.with_suffix(".paused").exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "never reached the update of step 3"
        time.sleep(0.05)
    assert log.with_suffix(".paused").exists(), log.with_suffix(".err").read_text()[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert max(_rows(killed)) == 2  # step 3 was in flight

    proc = _launch("none", 0, killed, tmp_path / "resume")
    assert proc.wait(timeout=HANG_GUARD_S) == 0, (tmp_path / "resume.err").read_text()[-3000:]
    assert "resumed from" in (tmp_path / "resume.out").read_text()
    expected, got = _rows(straight), _rows(killed)
    assert sorted(got) == sorted(expected) == [1, 2, 3, 4]
    keys = ("loss/loss", "reward/mean", "update/grad_norm", "rollout/tokens", "sync/engine_bytes")
    for step in expected:
        for key in keys:
            assert got[step][key] == expected[step][key], (step, key)
    assert len({expected[s]["reward/mean"] for s in expected}) > 1  # the policy did move
    for name in ("policy/adapter/adapter_model.safetensors", "policy/model.safetensors"):
        assert (killed / name).read_bytes() == (straight / name).read_bytes(), name
