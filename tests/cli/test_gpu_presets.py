"""The qwen2 GPU presets (issue 50): Qwen2.5-Math-1.5B-Instruct and DeepSeek-R1-Distill-Qwen-1.5B
dry-run offline from their shipped configs, name their family, fit one H200, keep within the
model's positions; a context over them is refused in one line, exit 2, before any plan."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.cli.config_loader import load_config
from sparrow.models.model_config import read_model_config
from sparrow.models.shape import ModelShape

ROOT = Path(__file__).resolve().parents[2]
_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")

# preset -> (shipped config, tied LM head, max_position_embeddings), as the hub's config.json.
PRESETS = {
    "qwen2p5_math_1p5b_gpu": ("Qwen2.5-Math-1.5B-Instruct.json", True, 4096),
    "r1_distill_qwen_1p5b_gpu": ("DeepSeek-R1-Distill-Qwen-1.5B.json", False, 131072),
}


def _train(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    # An empty HF cache: no weights, configs or tokenizers on disk, and no network.
    env |= {"HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true", "HF_HOME": str(tmp_path / "hf")}
    cmd = [sys.executable, "-m", "sparrow.cli.train", f"run_dir={tmp_path / 'run'}", *overrides]
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_shape_and_context_fit_the_model(preset):
    shipped, tied, positions = PRESETS[preset]
    cfg = load_config([f"preset={preset}"])
    config, source = read_model_config(cfg.model)
    assert source == f"shipped {shipped}"
    shape = ModelShape.from_hf_config(config)
    assert config.model_type == "qwen2" and not config.use_sliding_window
    heads = (shape.num_q_heads, shape.num_kv_heads, shape.head_dim)
    assert (shape.hidden_size, shape.num_layers, shape.intermediate_size, heads) == (
        1536, 28, 8960, (12, 2, 128)
    )  # fmt: skip
    assert (shape.qkv_bias, shape.o_bias) == (True, False)  # qwen2: q/k/v biases only
    assert (shape.vocab_size, shape.tied_embeddings) == (151936, tied)
    assert config.max_position_embeddings == positions
    completion = max(cfg.rollout.max_new_tokens, cfg.rl.eval.max_new_tokens)
    assert cfg.data.max_prompt_tokens + completion <= positions


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_dry_runs_offline_and_fits_one_h200(preset, tmp_path):
    out = _train(tmp_path, f"preset={preset}", "dry_run=true")
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert "(qwen2) from its config" in first and f"shipped {PRESETS[preset][0]}" in first
    assert "memory plan (H200 (no GPU here): 139.0 GiB)" in out.stdout
    for phase in ("engine resident", "prefill peak", "decode peak", "log-probs", "actor step"):
        assert phase in out.stdout
    assert "memory: peak" in out.stdout and "of 125.1 GiB usable" in out.stdout
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_context_over_the_models_positions_is_refused_in_one_line(tmp_path):
    out = _train(tmp_path, "preset=qwen2p5_math_1p5b_gpu", "dry_run=true",
                 "rollout.max_new_tokens=3584")  # fmt: skip
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "4608 tokens, over Qwen/Qwen2.5-Math-1.5B-Instruct's 4096 positions" in lines[0]
    assert "memory plan" not in out.stdout
