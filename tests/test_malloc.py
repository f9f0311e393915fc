"""The CPU allocator tuning the entry points apply (sparrow/malloc.py)."""

import pytest
import torch

from sparrow import malloc


@pytest.mark.skipif(
    torch.cuda.is_available() or malloc.glibc_mallopt() is None,
    reason="applies on a Linux glibc host without CUDA",
)
def test_thresholds_are_raised_on_a_cpu_host():
    assert malloc.tune_cpu_allocator() is True
    assert malloc.tuned


def test_nothing_is_done_on_a_cuda_host(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(malloc, "tuned", False)
    assert malloc.tune_cpu_allocator() is False
    assert not malloc.tuned
