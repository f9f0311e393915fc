"""Weights that stop being finite stop the run before anything of the step is saved.

Fast: the guard's norm flags NaN, Inf and overflowing weights and names the last good
checkpoint. Slow: `actor.lr=1e37` on a real `sparrow-train preset=smoke`, resumed from a good
two-step run: exit 3 with one line, no checkpoint of the broken step, the good ones intact, and
a resume with a sane learning rate finishes the run.
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hang_guard import HANG_GUARD_S
from torch import nn

from sparrow.train.run.checkpoint import verify

ROOT = Path(__file__).resolve().parents[3]
PAUSE_AT = Path(__file__).resolve().parents[1] / "pause_at.py"
_DIST = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
ENV = {k: v for k, v in os.environ.items() if k not in _DIST}
ENV |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize("bad", [math.nan, math.inf, 1e30])
def test_guard_stops_on_non_finite_or_overflowing_weights(bad):
    from sparrow.train.run.weight_guard import NonFiniteWeights, check_weights

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    assert math.isfinite(check_weights(model, 1, 7, lambda: None))
    with torch.no_grad():
        model[1].weight[0, 1] = bad
    with pytest.raises(NonFiniteWeights) as caught:
        check_weights(model, 1, 7, lambda: Path("runs/x/checkpoints/step_000006"))
    message = str(caught.value)
    assert "not finite after the update of step 7" in message
    assert "the last good checkpoint runs/x/checkpoints/step_000006 is kept" in message


COMMON = [
    "preset=smoke",
    "rl.save_every=1",
    "rl.eval.every=0",
    "rl.reward.name=test_length",  # non-zero advantages: the weights really move
]


def _train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(PAUSE_AT), "none", "0", str(run_dir / "x"), *COMMON]
    return subprocess.run(
        [*cmd, f"run_dir={run_dir}", *overrides],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


@pytest.mark.slow
def test_huge_learning_rate_stops_with_the_last_good_checkpoint_intact(tmp_path):
    run = tmp_path / "run"
    good = _train(run, "rl.steps=2")
    assert good.returncode == 0, good.stderr[-3000:]

    blown = _train(run, "rl.steps=4", "actor.lr=1e37", "resume_mismatch=allow")
    assert blown.returncode == 3, blown.stderr[-3000:]
    assert "Traceback" not in blown.stderr
    lines = [line for line in blown.stderr.splitlines() if line.startswith("sparrow-train:")]
    last_good = run / "checkpoints" / "step_000002"
    assert len(lines) == 1 and "not finite after the update of step 3" in lines[0], blown.stderr
    assert f"the last good checkpoint {last_good} is kept" in lines[0]
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["step_000001", "step_000002"]  # nothing of step 3, nothing pushed out
    assert all(verify(run / "checkpoints" / name) is None for name in names)
    steps = [line for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2  # the broken step was not logged

    again = _train(run, "rl.steps=4", "resume_mismatch=allow")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from {last_good} at step 2" in again.stdout
