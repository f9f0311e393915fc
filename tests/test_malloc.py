"""The CPU allocator tuning the entry points apply (sparrow/malloc.py)."""

import ctypes
import ctypes.util
import sys

import pytest
import torch

from sparrow import malloc


def _has_glibc_mallopt() -> bool:
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "mallopt")
    except OSError:
        return False


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or torch.cuda.is_available() or not _has_glibc_mallopt(),
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
