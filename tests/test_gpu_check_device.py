"""scripts/gpu_check.sh on the GPU it finds (issue 60): it reads the device's kind and memory
(nvidia-smi here faked on PATH), plans the step stages for that device (an H100: the README's
80 GB plans; an H200: 139 GiB) and scales their expected times by its bandwidth; the step and
distill stages' own settings fit an 80 GB GPU by the memory fit, as the bench will size them."""

import os
import stat
import subprocess

import pytest
from hang_guard import HANG_GUARD_S
from test_gpu_check_script import SCRIPT

from sparrow.cli.config_loader import load_config
from sparrow.models.model_config import read_model_config
from sparrow.models.shape import ModelShape
from sparrow.train.memory.fit import DeviceMemory, fit_memory
from sparrow.train.memory.plan import GiB

SMI = {"H100": "NVIDIA H100 80GB HBM3, 81559", "H200": "NVIDIA H200, 143771"}


def _fake_smi(tmp_path, line: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{line}'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    return str(bin_dir)


@pytest.mark.parametrize(
    ("kind", "plan_gib", "slower_pct"), [("H100", 80, 140), ("H200", 139, 100), ("none", 80, 140)]
)
def test_the_step_stages_plan_for_the_device_read(kind, plan_gib, slower_pct, tmp_path):
    """The script's device block (between its `# device:` markers) with nvidia-smi faked on
    PATH, and where neither nvidia-smi nor a CUDA torch answers (a CPU rehearsal)."""
    script = SCRIPT.read_text()
    block = script[script.index("# device: begin") : script.index("# device: end")]
    line = SMI.get(kind, "")
    path = _fake_smi(tmp_path, line) if line else str(tmp_path)
    env = {"PATH": path + os.pathsep + "/usr/bin:/bin", "PY": "false"}
    done = subprocess.run(
        ["bash", "-c", block + 'echo "$DEVICE_NAME|$PLAN_GIB|$SLOWER_PCT"'],
        env=env, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )  # fmt: skip
    name = line.split(",")[0] if line else "unknown"
    assert done.stdout.strip() == f"{name}|{plan_gib}|{slower_pct}", done.stdout + done.stderr
    run_step = script[script.index("    run_step() {") :]
    assert "expected=$(( $3 * SLOWER_PCT / 100 ))" in run_step  # the skip rule's times scale


def test_no_stage_names_an_h200_figure_the_device_does_not_give():
    script = SCRIPT.read_text()
    assert 'memory.device_gib="$PLAN_GIB"' in script  # the step benches' plan is the device's
    body = script[script.index('case "$STAGE" in\nkernels)') :]
    assert "139" not in body and "H200_" not in body


@pytest.mark.parametrize("stage", ["step", "distill"])
def test_the_step_stages_settings_fit_an_80_gb_gpu(stage):
    """The step bench's config at its default size (scripts/gpu_check.sh: 2 prompts x 8 x
    8192 tokens; distill: 4096 tokens, one row per adapter micro-batch) on an 80 GB device."""
    script = SCRIPT.read_text()
    tokens = 4096 if stage == "distill" else 8192
    assert f'"${{STEP_NEW_TOKENS:-{8192}}}"' in script and "STEP_DISTILL_TOKENS:-4096" in script
    pages = 2 * 8 * (tokens // 16 + 8) + 256
    extra = ["distill=default", "distill.micro_batch_size=1"] if stage == "distill" else []
    cfg = load_config(["preset=qwen3_1p7b_gpu", "data=arithmetic",
                       f"rollout.max_new_tokens={tokens}", f"rollout.engine.num_pages={pages}",
                       "rl.prompts_per_step=2", "rl.group_size=8", "memory.device_gib=80",
                       *extra])  # fmt: skip
    config, _ = read_model_config(cfg.model)
    device = DeviceMemory(80 * GiB, "memory.device_gib", cfg.memory.headroom)
    fitted = fit_memory(cfg, ModelShape.from_hf_config(config), 1, True, device)
    assert fitted.plan.peak_phase()[1] <= device.usable
