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
