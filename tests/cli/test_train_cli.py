"""sparrow-train end to end on the tiny model: config errors, the smoke preset, SIGKILL + resume."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]
# An in-process DenseActor earlier in the session exports these (torch.distributed env init);
# a child sparrow-train must start its own single-process group, not join that one.
_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    return env | {"HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true"} | extra


def _train(*overrides, **kwargs):
    env = _env()
    cmd = [sys.executable, "-m", "sparrow.cli.train", *overrides]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, **kwargs)


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss/loss"] for r in rows}


def test_print_composed_config():
    out = _train("preset=tiny", "--cfg", "job", timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr
    assert "name: tiny-qwen3" in out.stdout and "steps: 2" in out.stdout


@pytest.mark.parametrize(
    "override, expected",
    [
        ("rl.nonexistent=1", "Key 'nonexistent' not in 'RLConfig'"),
        ("rl.steps=abc", "rl.steps=abc"),
        ("model=nope", "Could not find 'model/nope'"),
    ],
)
def test_bad_override_is_one_line_error(override, expected):
    out = _train(override, timeout=HANG_GUARD_S)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], out.stderr


def test_smoke_preset_two_steps_end_to_end(tmp_path):
    # ~20 s alone on the 2-core VM; the timeout is a hang guard only.
    out = _train("preset=smoke", f"run_dir={tmp_path}", timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]  # step 0: the evaluation before training
    assert 0.0 <= rows[0]["eval/accuracy"] <= 1.0
    for row in rows[1:]:
        for key in ("reward/mean", "loss/loss", "accept/p5_min", "kv_read_ratio"):
            assert isinstance(row[key], float), (key, row.get(key))
        assert row["rollout/tokens"] > 0
        assert row["rollout/preemptions"] == 0.0  # a 256-page pool never preempts this batch
    assert 0.0 <= rows[-1]["eval/accuracy"] <= 1.0  # the preset evaluates at its last step
    for row in (rows[0], rows[-1]):  # a few completions per evaluation, for people to read
        samples = row["eval/samples"]
        assert len(samples) == 3 and all(isinstance(s["completion"], str) for s in samples)
        assert {"prompt", "answer", "score"} <= set(samples[0])
    assert (tmp_path / "checkpoints" / "step_000002" / "COMPLETE").is_file()
    assert (tmp_path / "policy" / "config.json").is_file()
    assert "step 2/2" in out.stdout
    assert re.search(r"step 1/2 .* \| 50% \| \S+ elapsed, eta \S+", out.stdout), out.stdout
    assert re.search(r"step 2/2 .* \| 100% \| \S+ elapsed, eta 0s", out.stdout), out.stdout


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted(tmp_path):
    common = ["preset=tiny", "rl.steps=4", "rl.save_every=2", "rl.eval.every=0"]
    straight = tmp_path / "straight"
    out = _train(*common, f"run_dir={straight}", timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr[-3000:]

    killed = tmp_path / "killed"
    env = _env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparrow.cli.train", *common, f"run_dir={killed}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    marker = killed / "checkpoints" / "step_000002" / "COMPLETE"
    deadline = time.monotonic() + HANG_GUARD_S
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the first checkpoint never appeared"
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)  # in step 3: the step in flight is what the kill may lose
    proc.wait()
    assert not (killed / "checkpoints" / "step_000004").exists()

    out = _train(*common, f"run_dir={killed}", "resume=auto", timeout=HANG_GUARD_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step_000002 at step 2" in out.stdout
    expected, got = _losses(straight), _losses(killed)
    for step in (3, 4):
        assert got[step] == expected[step], (step, got[step], expected[step])
