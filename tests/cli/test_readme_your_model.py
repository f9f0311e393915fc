"""The block of docs/guide/your-model-data-reward.md runs as written, in order, on a CPU machine
(slow: start-up dominates, minutes per command on a loaded 2-core box): the tiny families train,
the shipped GSM8K-shaped file and the user's reward feed a run whose evaluations report pass@k,
`sparrow-eval` scores its exported policy, and the two GPU presets dry-run offline.

The commands are read from the guide's first block (parsed as tests/cli/test_documented_commands.py
parses every document), in a temporary folder holding a copy of examples/, so a command changed
there is the command run here.
"""

import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S
from test_documented_commands import Command, extract

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide" / "your-model-data-reward.md"
_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def section_commands() -> list[Command]:
    block = GUIDE.read_text().split("```bash", 1)[1].split("```", 1)[0]
    return [c for c in extract(f"```bash{block}```", GUIDE.name) if not c.mention]


def _option(command: Command, key: str) -> str | None:
    found = [w.split("=", 1)[1] for w in command.args if w.startswith(f"{key}=")]
    return found[-1] if found else None


def test_the_block_covers_families_data_reward_evaluation_and_presets():
    commands = section_commands()
    train = [c for c in commands if c.program == "sparrow-train"]
    models = {_option(c, "model") for c in train}
    assert {"tiny_qwen2", "tiny_mistral"} <= models
    data = next(c for c in train if _option(c, "data.source"))
    assert _option(data, "data.source") == "examples/gsm8k_mini.jsonl"
    assert _option(data, "data.answer_extractor") == "gsm8k"
    reward = _option(data, "rl.reward.function")
    assert reward and reward.startswith("examples/") and (ROOT / reward.split(":")[0]).is_file()
    assert int(_option(data, "rl.eval.samples") or 1) > 1
    evals = [c for c in commands if c.program == "sparrow-eval"]
    assert evals and evals[0].args[0] == _option(data, "run_dir")
    dry = {_option(c, "preset") for c in train if _option(c, "dry_run") == "true"}
    assert dry == {"qwen2p5_math_1p5b_gpu", "r1_distill_qwen_1p5b_gpu"}
    cpu = [c for c in train if _option(c, "dry_run") != "true"]
    assert all(_option(c, "preset") == "tiny" for c in cpu)  # 2 steps each


def _finite_metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows, run_dir
    for row in rows:
        for key, value in row.items():
            if isinstance(value, float):
                assert math.isfinite(value), (run_dir, key, value)
    return rows


def _check(command: Command, stdout: str, cwd: Path) -> None:
    if command.program == "sparrow-eval":  # accuracy and the k-sample metrics, with CIs
        assert re.search(r"^accuracy [\d.]+ \(95% CI [\d.]+-[\d.]+, n=\d+\)$", stdout, re.M)
        for metric in ("pass@2", "pass@4", "mean@4"):
            assert re.search(rf"^{metric} [\d.]+ \(95% CI", stdout, re.M), stdout
    elif _option(command, "dry_run") == "true":
        assert "(qwen2) from its config (shipped" in stdout
        assert "memory plan (H200 (no GPU here): 139.0 GiB)" in stdout
        assert re.search(r"^memory: peak [\d.]+ GiB .* of 125\.1 GiB usable", stdout, re.M)
    else:
        rows = _finite_metrics(cwd / _option(command, "run_dir"))
        if _option(command, "rl.eval.samples"):
            assert any("eval/pass@4" in row for row in rows), rows[-1].keys()


@pytest.mark.slow
def test_the_block_runs_as_written(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    env |= {"HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true", "HF_HOME": str(tmp_path / "hf")}
    commands = section_commands()
    assert len(commands) >= 5
    for command in commands:  # in order: sparrow-eval reads the run the block trained
        script = Path(sys.executable).with_name(command.program)
        out = subprocess.run([str(script), *command.args], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=2 * HANG_GUARD_S)  # fmt: skip
        shown = shlex.join(command.words)
        assert out.returncode == 0, f"{shown}: {out.stderr[-2000:]}"
        _check(command, out.stdout, tmp_path)
