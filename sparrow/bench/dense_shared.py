"""`sparrow-bench dense-shared`: dense decode of samples of one prompt, the pages they share read
once through the fused C++ kernel (the engine's choice on a CPU since cfbbe83) against per-row
contiguous copies (`EngineConfig.shared_page_kernel=False`), two engines alternating in one
process.

    sparrow-bench dense-shared --context 2458 --samples 4 --new-tokens 256 --rounds 5
    sparrow-bench dense-shared --context 4096 --samples 8 --new-tokens 128 --rounds 4

Prints decode tokens/s per round for each path (random prompt tokens, T = 1) and their ratio
(median kernel / median copies). Only the ratio within one run means anything on a shared VM.
The fused kernel is the CPU fp32 path: where it does not run (CUDA, another dtype or backend)
both engines decode alike and `fused_kernel` in the JSON is false.
"""

import argparse
import json
import statistics
from pathlib import Path

import torch

from sparrow.bench.device import load_bench_model, resolve_device_args
from sparrow.cli.errors import ArgumentParser, at_least
from sparrow.kernels import resolve_backend
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams

ARMS = {"kernel": True, "copies": False}  # arm -> EngineConfig.shared_page_kernel


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lm = load_bench_model(args)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, lm.model.config.vocab_size, (args.context,), generator=gen)
    params = SamplingParams(temperature=1.0, max_tokens=args.new_tokens, ignore_eos=True)
    engines = {
        arm: LLMEngine(lm.model, lm.tokenizer, _engine_config(args, shared))
        for arm, shared in ARMS.items()
    }
    rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for _ in range(args.rounds):
        for arm, engine in engines.items():
            engine.generate([prompt.tolist()], params, n=args.samples)
            stats = engine.last_stats
            assert stats is not None  # every generate call sets it
            rates[arm].append(stats.decode_tok_s)
            print(f"{arm:7s} {rates[arm][-1]:6.1f} decode tok/s", flush=True)
    medians = {arm: statistics.median(values) for arm, values in rates.items()}
    report = {
        "config": {**vars(args), "threads": torch.get_num_threads()},
        "fused_kernel": _fused_kernel_runs(args),
        **{arm: {"decode_tok_s": medians[arm], "rounds": rates[arm]} for arm in ARMS},
        "ratio": medians["kernel"] / medians["copies"] if medians["copies"] else None,
    }
    for arm, values in rates.items():
        print(f"{arm}: " + " ".join(f"{x:.1f}" for x in values))
    print(f"kernel / copies (medians): {report['ratio']:.2f}x")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


def _fused_kernel_runs(args) -> bool:
    """Whether the engine's decode takes the fused C++ kernel for this device and dtype (the
    engine's backend is "auto"): only then do the two arms differ."""
    like = torch.empty(0, dtype=getattr(torch, args.dtype), device=args.device)
    return resolve_backend("auto", like) == "cpp"


def _engine_config(args, shared_page_kernel: bool) -> EngineConfig:
    # The pool holds the samples' pages (the prompt's shared, each completion its own) and no
    # more: two engines live in the process at once.
    prompt_pages = -(-args.context // args.page_size)
    completion_pages = -(-args.new_tokens // args.page_size) + 1
    return EngineConfig(
        page_size=args.page_size,
        num_pages=prompt_pages + args.samples * completion_pages + 8,
        max_batch_size=max(args.samples, 1),
        dtype=args.dtype,
        linear_backend=args.linear_backend,
        shared_page_kernel=shared_page_kernel,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(prog="sparrow-bench dense-shared", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--device", default=None, help="default: CUDA when present, else the CPU")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on a CPU")
    p.add_argument("--context", type=at_least(1), default=2458, help="prompt tokens")
    p.add_argument("--samples", type=at_least(1), default=4, help="completions of the prompt")
    p.add_argument("--new-tokens", type=at_least(1), default=256, help="tokens per completion")
    p.add_argument("--rounds", type=at_least(1), default=5, help="alternations of the two paths")
    p.add_argument("--page-size", type=at_least(1), default=16)
    p.add_argument("--linear-backend", default="onednn", choices=["torch", "onednn"])
    p.add_argument("--threads", type=at_least(0), default=2, help="torch threads (0: its default)")
    p.add_argument("--json", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    resolve_device_args(args)
    return args
