"""TensorBoard as a second logger: the event files hold metrics.jsonl's scalars, each step once,
read back with TensorBoard's own reader (EventAccumulator, which applies the purges a resumed
writer asks for).

Fast: the logger alone through a torn event file and a resume that redoes steps. Default suite:
a real smoke run (tests/conftest.py's `smoke_run`). Slow: a real `sparrow-train preset=tiny`
SIGKILLed inside a checkpoint write (its row already logged, the step redone) and inside a
rollout, then finished with resume=auto.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hang_guard import HANG_GUARD_S
from tensorboard.backend.event_processing import event_accumulator

from sparrow.train.logs.metrics_logger import (
    LoggerConfig,
    MetricsLogger,
    TensorBoardConfig,
    WandbConfig,
)
from sparrow.train.logs.tensorboard import event_files

ROOT = Path(__file__).resolve().parents[3]
PAUSE_AT = ROOT / "tests" / "train" / "pause_at.py"


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} as TensorBoard shows them (every event kept, purges applied)."""
    acc = event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={event_accumulator.SCALARS: 0}
    )
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def assert_equal_to_jsonl(run_dir: Path, log_dir: Path) -> int:
    """Every numeric metric of every metrics.jsonl row is in TensorBoard once, with its value
    (TensorBoard stores float32), and TensorBoard holds nothing else; returns the count."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    expected = {}
    for row in rows:
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)):
                expected.setdefault(key, []).append((row["step"], np.float32(value)))
    got = tensorboard_scalars(log_dir)
    assert sorted(got) == sorted(expected)
    for tag, points in expected.items():
        assert [(s, np.float32(v)) for s, v in got[tag]] == points, tag
    return sum(len(p) for p in expected.values())


def _logger(run_dir: Path) -> MetricsLogger:
    cfg = LoggerConfig(
        wandb=WandbConfig(mode="disabled"), tensorboard=TensorBoardConfig(enabled=True)
    )
    return MetricsLogger(cfg, run_dir, {})


def _row(step: int, launch: int) -> dict:
    return {"loss/loss": step / 10 + launch, "accept/p5/bin0": 0.9 - step / 100, "tag": "x"}


def test_resume_keeps_each_step_once_in_tensorboard(tmp_path):
    first = _logger(tmp_path)
    first.resume_at(-1)
    for step in range(1, 6):
        first.log_histogram(step, "accept/histogram", [0.5, 0.9, 1.0])
        first.log(step, _row(step, 0))
    first.close()
    # A kill in the middle of the step-5 event: the file ends in half a record.
    (events,) = event_files(tmp_path / "tensorboard")
    events.write_bytes(events.read_bytes()[:-20])
    assert tensorboard_scalars(tmp_path / "tensorboard")["loss/loss"][-1][0] == 4

    second = _logger(tmp_path)
    second.resume_at(5)  # the step-5 checkpoint: its row comes back from metrics.jsonl
    second.close()
    assert assert_equal_to_jsonl(tmp_path, tmp_path / "tensorboard") == 10

    third = _logger(tmp_path)
    third.resume_at(3)  # an older checkpoint: steps 4 and 5 are redone, with other numbers
    for step in (4, 5):
        third.log(step, _row(step, 1))
    third.close()
    assert assert_equal_to_jsonl(tmp_path, tmp_path / "tensorboard") == 10
    assert tensorboard_scalars(tmp_path / "tensorboard")["loss/loss"][-1] == (5, np.float32(1.5))
    assert len(event_files(tmp_path / "tensorboard")) == 3  # one file per launch


def test_smoke_run_tensorboard_equals_metrics_jsonl(smoke_run):
    count = assert_equal_to_jsonl(smoke_run, smoke_run / "tensorboard")
    assert count > 100  # the smoke run's ~90 scalars over three rows, eval included
    guidance = {event_accumulator.HISTOGRAMS: 0}  # keep every step (the default keeps one)
    acc = event_accumulator.EventAccumulator(str(smoke_run / "tensorboard"), size_guidance=guidance)
    acc.Reload()
    assert acc.Tags()["histograms"] == ["accept/histogram"]
    assert [e.step for e in acc.Histograms("accept/histogram")] == [1, 2]


_DIST = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
ENV = {k: v for k, v in os.environ.items() if k not in _DIST}
ENV |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
COMMON = [
    "preset=tiny",
    "rl.steps=4",
    "rl.save_every=1",
    "rl.eval.every=0",
    "rl.reward.name=test_length",  # non-zero advantages: the redone steps' numbers differ
    "logger.tensorboard.enabled=true",
]


def _launch(run_dir: Path, log: Path, phase: str, step: int) -> subprocess.Popen:
    marker = log.with_suffix(".paused")
    cmd = [sys.executable, str(PAUSE_AT), phase, str(step), str(marker), *COMMON]
    with open(log.with_suffix(".out"), "w") as out, open(log.with_suffix(".err"), "w") as err:
        return subprocess.Popen(
            [*cmd, f"run_dir={run_dir}"],
            cwd=ROOT,
            env=ENV,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )


@pytest.mark.slow
def test_sigkill_and_resume_keep_each_step_once_in_tensorboard(tmp_path):
    run_dir = tmp_path / "run"
    for i, (phase, step) in enumerate([("checkpoint", 2), ("rollout", 3)]):
        log = tmp_path / f"launch{i}"
        proc = _launch(run_dir, log, phase, step)
        deadline = time.monotonic() + HANG_GUARD_S  # a hang guard only
        paused = log.with_suffix(".paused")
        while not paused.exists() and time.monotonic() < deadline:
            assert proc.poll() is None, log.with_suffix(".err").read_text()[-3000:]
            time.sleep(0.05)
        assert paused.exists(), log.with_suffix(".err").read_text()[-3000:]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    final = _launch(run_dir, tmp_path / "final", "none", 0)
    assert final.wait(timeout=HANG_GUARD_S) == 0, (tmp_path / "final.err").read_text()[-3000:]

    # Step 2 was logged by the first launch and redone by the second: TensorBoard keeps the
    # second's numbers only, like metrics.jsonl.
    assert assert_equal_to_jsonl(run_dir, run_dir / "tensorboard") > 4 * 50
    assert [s for s, _ in tensorboard_scalars(run_dir / "tensorboard")["loss/loss"]] == [1, 2, 3, 4]
    assert len(event_files(run_dir / "tensorboard")) == 3
