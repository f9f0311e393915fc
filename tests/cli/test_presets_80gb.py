"""The GPU presets on the 80 GB GPU most users have (issue 60): each dry run, as a user types it,
fits with what the fit turns on named on the plan line (the flagship qwen3_1p7b_gpu refused at
93.8 GiB before the engine could sleep), and the README's preset x device table is the plans'."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.cli import device_table

ROOT = Path(__file__).resolve().parents[2]
_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")

# preset, ranks, what the plan line must say the fit did (None: fits as the preset is)
RUNS = [
    ("qwen3_1p7b_gpu", 1, "sized to fit: rollout.engine.sleep=kv"),
    ("r1_distill_qwen_1p5b_gpu", 1, None),
    ("qwen2p5_math_1p5b_gpu", 1, "sized to fit: rollout.engine.sleep=kv"),
    ("qwen3_4b_gpu", 4, "sized to fit: rollout.engine.sleep=kv"),
    ("qwen3_8b_gpu", 4, "sized to fit: rollout.engine.sleep=kv, actor.offload_optimizer=cpu"),
]


@pytest.mark.parametrize(("preset", "ranks", "sized"), RUNS)
def test_preset_dry_run_fits_80_gb(preset, ranks, sized, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    env |= {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "WORLD_SIZE": str(ranks)}
    cmd = [sys.executable, "-m", "sparrow.cli.train", f"preset={preset}", "dry_run=true",
           "memory.device_gib=80", f"run_dir={tmp_path / 'run'}"]  # fmt: skip
    out = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("memory: peak") and "of 72.0 GiB usable" in line, line
    if sized:
        assert sized in line and "the engine sleeps through the actor phases" in line
    else:
        assert "sized to fit" not in line


def test_the_readme_table_is_the_plans():
    assert device_table.main(["--check"]) == 0, "python -m sparrow.cli.device_table"
    text = device_table.README.read_text()
    assert device_table.regenerate(text.replace("67/72 GiB", "60/72 GiB")) == text
