"""Shared test setup: CPU by default; `gpu`-marked tests skip without CUDA.

Without CUDA the Triton kernels can only run under the interpreter, and TRITON_INTERPRET must be
set before anything imports triton: DeepSpeed and peft do at import time, so an in-process trainer
in an early test file would otherwise leave triton's own jit helpers compiled-mode and break the
interpreted kernels later in the session. With CUDA it stays unset (the `gpu` tests compile).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():  # importing torch does not import triton
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
