"""sparrow-train and the memory plan: a dry run offline from a shipped config (no weights on
disk), and a plan over the device refused in one line, exit 2, before anything runs."""

import os
import subprocess
import sys
from pathlib import Path

from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]
_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def _train(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    # An empty HF cache: no weights or configs on disk, and no network.
    env |= {"HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true", "HF_HOME": str(tmp_path / "hf")}
    cmd = [sys.executable, "-m", "sparrow.cli.train", f"run_dir={tmp_path / 'run'}", *overrides]
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )


def test_dry_run_plans_a_hub_model_offline_from_its_config(tmp_path):
    out = _train(
        tmp_path, "dry_run=true", "model=hf", "model.name=Qwen/Qwen3-1.7B", "rollout=gpu",
        "monitor=gpu", "schedule=qwen3_1p7b_tau086", "actor=zero2",
        "actor.max_tokens_per_micro_batch=32768", "rollout.engine.num_pages=24576",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "shipped Qwen3-1.7B.json" in out.stdout
    assert "memory plan (H200 (no GPU here): 139.0 GiB)" in out.stdout
    for phase in ("engine resident", "prefill peak", "decode peak", "log-probs", "actor step"):
        assert phase in out.stdout
    assert "44.62 GiB" in out.stdout  # KV pool 42 + page summaries 2.62
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_dry_run_refuses_a_plan_over_the_device_naming_the_phase(tmp_path):
    # One rank: Qwen3-8B's weights, engine copy and optimizer state overfill 80 GB before any
    # activation; with the offload kept off (set here, so not sized) the refusal names it.
    out = _train(
        tmp_path, "dry_run=true", "preset=qwen3_8b_gpu", "memory.device_gib=80",
        "actor.offload_optimizer=none",
    )  # fmt: skip
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "memory plan does not fit: resident needs" in lines[0]
    assert "memory.device_gib 80.0 GiB" in lines[0] and "actor.zero_stage" in lines[0]
    assert "set actor.offload_optimizer=cpu" in lines[0]


def test_dry_run_refuses_offloaded_state_over_the_host_ram(tmp_path):
    out = _train(
        tmp_path, "dry_run=true", "preset=qwen3_8b_gpu", "memory.device_gib=80",
        "memory.host_gib=64", "actor.offload_optimizer=cpu",
    )  # fmt: skip
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "memory plan does not fit the host: ZeRO-Offload holds 122.1 GiB" in lines[0]
    assert "actor.offload_optimizer=none" in lines[0]


def test_a_run_over_the_device_stops_before_its_first_rollout(tmp_path):
    # Checkpointing off and a huge token budget, both set here: nothing may be sized. The plan
    # sizes the micro-batch the actor really cuts (rows x their longest sequence), so the
    # completions are long enough for the actor step to exceed 1 GiB (1.2 GiB planned).
    out = _train(
        tmp_path, "preset=smoke", "memory.device_gib=1", "actor.activation_checkpointing=false",
        "actor.max_tokens_per_micro_batch=100000000", "rollout.max_new_tokens=2048",
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "actor step needs" in lines[0] and "actor.max_tokens_per_micro_batch" in lines[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert not (tmp_path / "run" / "checkpoints").exists()
