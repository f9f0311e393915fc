"""`sparrow-bench decode-step`'s arguments: the GPU headline's shape by default on CUDA, a tiny
one on a CPU (sparrow/bench/decode_step.py runs them)."""

import argparse

import torch

from sparrow.bench.device import bench_device

DESCRIPTION = "one whole-model decode step, sparse against dense, as the engine runs it"
# (GPU, CPU) defaults: the headline shape, and a tiny one that a CPU test runs in seconds.
DEFAULTS = {
    "model": ("qwen3-1.7b", "qwen3-debug"),
    "context": (32768, 256),
    "budget_tokens": (2048, 64),
    "batches": ([16, 64], [4]),
    "samples": (8, 2),
    "dtype": ("bfloat16", "float32"),
    "iters": (20, 5),
    "warmup": (3, 1),
    "profile_steps": (3, 0),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sparrow-bench decode-step", description=DESCRIPTION)
    p.add_argument("--device", default=None, help="default: CUDA when present, else the CPU")
    p.add_argument("--model", default=None, help="random weights of this shape (random_init.py)")
    p.add_argument("--context", type=int, default=None, help="tokens cached per sequence")
    p.add_argument("--budget-tokens", type=int, default=None, help="sparse layers' budget")
    p.add_argument("--batches", type=int, nargs="+", default=None, help="sequences per step")
    p.add_argument("--samples", type=int, default=None, help="samples per prompt (GRPO group)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"])
    p.add_argument("--iters", type=int, default=None, help="timed steps per arm (median)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps per arm first")
    p.add_argument(
        "--profile-steps", type=int, default=None,
        help="GPU: profiled steps per configuration for the host share, in a pass after every "
        "timed one (0: none)",
    )  # fmt: skip
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "triton", "cpp"],
                   help="attention kernels (EngineConfig.backend)")  # fmt: skip
    p.add_argument(
        "--compile-only", action="store_true",
        help="the warm-up alone: compile and capture what the timed run meets",
    )  # fmt: skip
    p.add_argument(
        "--graphs", default="auto", choices=["auto", "on", "off"],
        help="CUDA graphs: auto = both on and off on CUDA, off on a CPU",
    )  # fmt: skip
    p.add_argument(
        "--speculative-k", type=int, default=0,
        help="also time a dense verify pass of K + 1 positions per sequence (the speculative "
        "arm, decode_step_spec.py); 0: no arm",
    )  # fmt: skip
    p.add_argument("--json", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    args.device = torch.device(args.device) if args.device else bench_device()
    gpu = args.device.type == "cuda"
    for name, (on_gpu, on_cpu) in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, on_gpu if gpu else on_cpu)
    if args.graphs == "auto":
        args.graphs = [True, False] if gpu else [False]
    else:
        args.graphs = [args.graphs == "on"]
    if True in args.graphs and not gpu:
        p.error("--graphs on needs CUDA")
    bad = [b for b in args.batches if b % args.samples]
    if bad or args.budget_tokens % args.page_size or args.context % args.page_size:
        p.error("batches must be multiples of --samples; context and budget of --page-size")
    if args.iters < 1:
        p.error("--iters must be >= 1")
    if not 0 <= args.speculative_k <= 8:
        p.error("--speculative-k must be in 0..8")
    return args
