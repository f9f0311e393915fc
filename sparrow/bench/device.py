"""The one device a benchmark builds on, chosen up front: CUDA when present, else the CPU.

Every `sparrow-bench` subcommand parses `--device` with `bench_device()` as its default and
builds its weights, caches and inputs there, so that a GPU run never hands a compiled Triton
kernel a tensor left on the CPU (`sparrow-bench decode` once did: the interpreter was switched
on only without CUDA, the model was built on the CPU either way). Seeded random values come from
the chosen device's own generator (`seeded`): one device, no host copy of a 1.7B model.
"""

import contextlib
import os

import torch


def bench_device() -> torch.device:
    """CUDA (the current device) when torch sees one, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def interpret_triton_without_cuda() -> None:
    """Run Triton kernels in the interpreter where no GPU compiles them. Before anything imports
    triton; with CUDA the variable is left alone (the kernels compile)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


@contextlib.contextmanager
def seeded(device: torch.device, seed: int):
    """torch's random functions seeded with `seed` on `device` inside, the caller's random state
    restored after (random values made where they are used: no CPU copy to move)."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resolve_device_args(args) -> None:
    """Fill a bench's `--device` (bench_device()), `--dtype` (bfloat16 on CUDA, float32 on a CPU)
    and, where it has one, `--linear-backend` (oneDNN's packed GEMMs are CPU fp32 only: torch
    elsewhere) in place."""
    args.device = torch.device(args.device) if args.device else bench_device()
    if getattr(args, "dtype", "") is None:
        args.dtype = "bfloat16" if args.device.type == "cuda" else "float32"
    if getattr(args, "linear_backend", None) == "onednn" and (
        args.device.type != "cpu" or args.dtype != "float32"
    ):
        args.linear_backend = "torch"


def load_on_device(args):
    """The bench's `--model` in its `--dtype`, moved to its `--device` (LoadedModel): the engine
    builds on the device of the weights it is given."""
    from sparrow.models.loading import ModelConfig, load_model

    loaded = load_model(ModelConfig(args.model, dtype=args.dtype))
    loaded.model.to(args.device)
    return loaded


def load_bench_model(args):
    """A model bench's start: its `--threads` (0: torch's default), then `--model` loaded on
    its device (load_on_device); a model not found exits naming `--model`."""
    from sparrow.cli.errors import model_not_found

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return load_on_device(args)
    except OSError as err:
        model_not_found(err, "--model", args.model)
        raise
