"""`sparrow-train preset=tiny actor.lora.rank=8 rl.steps=4` learns its task: under a reward the
tiny random model can move on (tests/data/lora_reward.py, the share of digits in the completion),
four LoRA updates take the held-out evaluation from the step-0 policy's score to a higher one, by
the paired comparison on the same prompts (eval/delta and its 95% interval, as the default run's
claim reads it). The evaluation runs on the rollout engine, so it also shows the trained adapter
reached the engine (the base alone scores the step-0 value again)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]
_DIST = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
ENV = {k: v for k, v in os.environ.items() if k not in _DIST} | {"HF_HUB_OFFLINE": "1"}


def test_a_tiny_lora_run_learns_its_task(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "sparrow.cli.train",
        "preset=tiny",
        "actor.lora.rank=8",
        "rl.steps=4",
        "rl.reward.function=tests/data/lora_reward.py:digit_share",
        "actor.lr=1e-2",  # LoRA's usual lr is ~10x full fine-tuning's
        "rl.eval.every=4",
        "rl.eval.num_prompts=16",
        f"run_dir={tmp_path}",
    ]
    done = subprocess.run(
        cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        r["step"]: r
        for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().split("\n")[:-1])
    }
    assert rows[4]["eval/accuracy"] > rows[0]["eval/accuracy"]
    assert rows[4]["eval/delta_lo95"] > 0  # the paired 95% interval excludes no change
    assert all(rows[s]["sync/engine_bytes"] == rows[1]["sync/engine_bytes"] for s in (2, 3, 4))
