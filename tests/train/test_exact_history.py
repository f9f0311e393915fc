"""Run history after kills: every step once in metrics.jsonl, and every step in the W&B files.

Fast: the metrics file cut back to the resumed step (redone steps, a torn line, a row glued onto
a torn one), and the logger re-sending the kept rows to a W&B offline run that lost them. Slow:
a real `sparrow-train preset=smoke` SIGKILLed (whole process group, wandb's service included) at
random points three times in a row (a random delay after a given step is logged, so that every
launch both redoes a logged step and makes progress), then finished; its metrics.jsonl must
equal an uninterrupted run's (timings aside) and its offline W&B files must hold every step.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S
from wandb_files import logged_steps, wait_until_written

from sparrow.train.logs.metrics_logger import LoggerConfig, MetricsLogger, WandbConfig

ROOT = Path(__file__).resolve().parents[2]
PAUSE_AT = Path(__file__).with_name("pause_at.py")
_DIST = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
ENV = {k: v for k, v in os.environ.items() if k not in _DIST}
ENV |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metrics_cut_back_to_the_resumed_step(tmp_path):
    from sparrow.train.run.history import truncate_metrics

    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": s / 10}) for s in (0, 1, 2, 3)]
    # A kill tore the step-4 row; the next launch glued its step-3 row onto it and went on.
    lines += ['{"step": 4, "lo' + json.dumps({"step": 3, "loss": 0.3}), '{"step": 4, "loss": 0.4}']
    path.write_text("\n".join(lines) + '\n{"step": 5, "los')
    kept = truncate_metrics(path, 2).rows
    assert kept == [{"step": s, "loss": s / 10} for s in (0, 1, 2)]
    assert _rows(path) == kept
    truncate_metrics(path, -1)  # a fresh start in the same run dir
    assert path.read_text() == ""


def test_resumed_logger_restores_the_steps_wandb_lost(tmp_path):
    cfg = LoggerConfig(wandb=WandbConfig(mode="offline"))
    first = MetricsLogger(cfg, tmp_path, {"lr": 1.0})
    for step in range(5):
        first.log(step, {"loss": step / 10})
    first.close()
    wait_until_written(tmp_path)  # wandb's service may still write after finish() returned
    # What a SIGKILL leaves: W&B lost the buffered steps, metrics.jsonl holds a torn last line.
    for run in (tmp_path / "wandb").glob("offline-run-*"):
        shutil.rmtree(run)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')

    second = MetricsLogger(cfg, tmp_path, {"lr": 1.0})
    second.resume_at(3)  # the checkpoint the next launch resumed from
    for step in (4, 5):
        second.log(step, {"loss": step / 10})
    second.close()
    wait_until_written(tmp_path)
    assert [row["step"] for row in _rows(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3, 4, 5]
    wandb_steps = logged_steps(tmp_path)
    assert sorted(wandb_steps) == [0, 1, 2, 3, 4, 5]
    assert [wandb_steps[s]["loss"] for s in range(6)] == [s / 10 for s in range(6)]
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 1  # one run id, resumed


# Enough steps that both random kills land before the run is over: alone on the VM a smoke step
# takes ~0.5 s, and with 6 steps the second random launch once resumed at the last step and
# finished before its kill.
STEPS = 10
# The first launch is frozen inside its step-2 checkpoint write (row logged, checkpoint not): a
# sure redo of a logged step, the case that used to log a step twice. The next two are killed at
# a random moment once they have logged a step of their own.
KILLS = ["checkpoint", "random", "random"]
COMMON = [
    "preset=smoke",
    f"rl.steps={STEPS}",
    "rl.save_every=1",
    "rl.eval.every=2",
    "rl.reward.name=test_length",  # non-zero advantages: the weights really move
]
TIMING = ("time/", "speedup/measured", "memory/")  # and every *_tok_s rate


def _launch(run_dir: Path, log: Path, phase: str = "none", step: int = 0) -> subprocess.Popen:
    marker = log.with_suffix(".paused")
    cmd = [sys.executable, str(PAUSE_AT), phase, str(step), str(marker), *COMMON]
    cmd.append(f"run_dir={run_dir}")
    with open(log.with_suffix(".out"), "w") as out, open(log.with_suffix(".err"), "w") as err:
        return subprocess.Popen(
            cmd, cwd=ROOT, env=ENV, stdout=out, stderr=err, start_new_session=True
        )


def _wait(proc: subprocess.Popen, log: Path, done) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not done() and time.monotonic() < deadline:
        assert proc.poll() is None, log.with_suffix(".err").read_text()[-3000:]
        time.sleep(0.02)
    assert done(), log.with_suffix(".err").read_text()[-3000:]


def _last_step(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return -1
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines()[:-1]]
    return max(steps, default=-1)  # the last line may be in the middle of its write


def _comparable(rows: list[dict]) -> list[dict]:
    return [
        {k: v for k, v in row.items() if not k.startswith(TIMING) and not k.endswith("_tok_s")}
        for row in rows
    ]


@pytest.mark.slow
def test_three_random_kills_leave_an_exact_history(tmp_path):
    straight = tmp_path / "straight"
    proc = _launch(straight, tmp_path / "straight")
    assert proc.wait(timeout=HANG_GUARD_S) == 0, (tmp_path / "straight.err").read_text()[-3000:]

    rng = random.Random(23)
    killed = tmp_path / "killed"
    for i, kind in enumerate(KILLS):
        log = tmp_path / f"launch{i}"
        proc = _launch(killed, log, *(("checkpoint", 2) if kind == "checkpoint" else ("none", 0)))
        try:
            if kind == "checkpoint":
                _wait(proc, log, lambda log=log: log.with_suffix(".paused").exists())
            else:  # the plan line comes after the resume; then one step of this launch
                _wait(proc, log, lambda log=log: " steps x " in log.with_suffix(".out").read_text())
                start = _last_step(killed)
                _wait(proc, log, lambda start=start: _last_step(killed) > start)
                time.sleep(rng.uniform(0.0, 0.5))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the process and wandb's service with it
            proc.wait()
        if i == 1:  # as if the kill had landed inside a write: a torn last line
            with open(killed / "metrics.jsonl", "a") as f:
                f.write('{"step": 99, "loss/lo')

    last = tmp_path / "final"
    proc = _launch(killed, last)
    assert proc.wait(timeout=HANG_GUARD_S) == 0, last.with_suffix(".err").read_text()[-3000:]
    redone = (tmp_path / "launch1.err").read_text()  # resumed at 1, the step-2 row was logged
    assert "metrics.jsonl: cut back to step 1 (1 later rows and 0 torn lines removed)" in redone

    got, expected = _rows(killed / "metrics.jsonl"), _rows(straight / "metrics.jsonl")
    assert [r["step"] for r in got] == [r["step"] for r in expected] == list(range(STEPS + 1))
    assert _comparable(got) == _comparable(expected)
    wait_until_written(killed)
    assert sorted(logged_steps(killed)) == list(range(STEPS + 1))
    weights = "policy/model.safetensors"
    assert (killed / weights).read_bytes() == (straight / weights).read_bytes()
