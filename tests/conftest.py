"""Shared test setup: CPU by default; `gpu`-marked tests skip without CUDA.

Without CUDA the Triton kernels can only run under the interpreter, and TRITON_INTERPRET must be
set before anything imports triton: DeepSpeed and peft do at import time, so an in-process trainer
in an early test file would otherwise leave triton's own jit helpers compiled-mode and break the
interpreted kernels later in the session. With CUDA it stays unset (the `gpu` tests compile).

The tiny models every package's tests share are session fixtures here (loaded once: ~1 s each);
helpers shared across packages sit in tests/tiny_lm.py, importable from any test folder because
pytest puts tests/ (this file's folder) on the import path.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():  # importing torch does not import triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hang_guard import HANG_GUARD_S  # noqa: E402
from tiny_lm import random_model  # noqa: E402

from sparrow.models.loading import (  # noqa: E402
    LoadedModel,
    ModelConfig,
    load_model,
    tiny_model_config,
)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_qwen3():
    return load_model(ModelConfig("tiny-qwen3"))


@pytest.fixture(scope="session")
def tiny_llama():
    return load_model(ModelConfig("tiny-llama"))


@pytest.fixture(scope="session")
def lively_llama(tiny_llama):
    """A tiny Llama with large random weights: greedy outputs vary with context (the default
    init repeats one token), so the engine tests can tell right from wrong KV."""
    config = tiny_model_config("llama", vocab_size=len(tiny_llama.tokenizer))
    config.initializer_range = 0.2
    return LoadedModel(random_model(config, seed=0), tiny_llama.tokenizer)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """One real `sparrow-train preset=smoke` run for the session's tests that read a run's
    outputs (the dashboard's keys, TensorBoard's event files), with every logged feature on:
    evaluation (the preset's), the measured speedup, TensorBoard, W&B offline."""
    import subprocess
    import sys
    from pathlib import Path

    run_dir = tmp_path_factory.mktemp("smoke_run")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    env |= {"HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true"}
    cmd = [sys.executable, "-m", "sparrow.cli.train", "preset=smoke", f"run_dir={run_dir}"]
    cmd += ["monitor.speedup_every=1", "logger.tensorboard.enabled=true"]
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        cmd, cwd=root, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir
