"""Every `sparrow-bench` subcommand chooses one device up front and builds everything there.

`sparrow-bench decode` once switched the Triton interpreter on only without CUDA but built its
model on the CPU either way, so on a GPU the compiled kernels got CPU tensors. planted_gpu.py
runs each subcommand in a fresh interpreter with TRITON_INTERPRET unset and a GPU planted
(`torch.cuda.is_available()` True): its module must leave the interpreter off, its parser must
choose CUDA, and its build must hold no CPU tensor (the chosen device stands in as `meta`, a
device other than the CPU that a CPU-only torch can build on; see planted_gpu.py).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hang_guard import HANG_GUARD_S

from sparrow.bench import device as bench_device_module
from sparrow.bench.cli import COMMANDS

CHILD = Path(__file__).with_name("planted_gpu.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def planted():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, str(CHILD)], capture_output=True, text=True, env=env, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_subcommand_is_checked(planted):
    assert set(planted) == set(COMMANDS)


# Subcommands that run on the CPU whatever the machine holds, and why.
CPU_BY_DESIGN = {"push": "two local ranks over gloo: a rollout rank would need a GPU of its own"}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_subcommand_builds_on_the_gpu_it_finds(planted, name):
    entry = planted[name]
    assert not entry["imports_interpreted"], "a GPU is present: the kernels must compile"
    assert entry["device"] == ("cpu" if name in CPU_BY_DESIGN else "cuda")
    assert entry["build"] == "ok", entry["build"]
    assert entry["cpu_tensors"] == [], f"{name} built tensors on the CPU: {entry['cpu_tensors']}"


def test_device_follows_cuda_presence(monkeypatch):
    assert bench_device_module.bench_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert bench_device_module.bench_device() == torch.device("cuda")


def test_device_arguments_default_by_device(monkeypatch):
    from argparse import Namespace

    args = Namespace(device=None, dtype=None, linear_backend="onednn")
    bench_device_module.resolve_device_args(args)
    assert (args.device.type, args.dtype, args.linear_backend) == ("cpu", "float32", "onednn")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args = Namespace(device=None, dtype=None, linear_backend="onednn")
    bench_device_module.resolve_device_args(args)
    # oneDNN's packed GEMMs are CPU fp32 only
    assert (args.device.type, args.dtype, args.linear_backend) == ("cuda", "bfloat16", "torch")
