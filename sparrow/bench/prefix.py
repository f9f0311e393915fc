"""`sparrow-bench prefix`: generate over few-shot prompts with the shared prefix computed once vs
every prompt prefilled in full (`EngineConfig.share_prefix` on vs off), in one process.

    sparrow-bench prefix --json runs/bench_prefix.json   # 200 held-out prompts: minutes on 2 cores
    sparrow-bench prefix --quick                         # 16 prompts, 8 tokens: a smoke run

Prompts: the held-out split of the arithmetic task with `--few-shot` worked examples as earlier
chat turns (every prompt starts with the same system prompt + examples), rendered with the model's
chat template. Greedy, `--new-tokens` each, EOS honoured as in evaluation. The two settings run
interleaved `--repeats` times (best of, the CPU may be shared); the table gives the wall time of
each, their ratio, the prefix length and whether both produced the same tokens.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from sparrow.bench.device import load_bench_model, resolve_device_args
from sparrow.cli.errors import ArgumentParser, at_least
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams, shared_prefix_tokens
from sparrow.tasks.generators import TaskConfig, generate_tasks


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lm = load_bench_model(args)
    prompts = few_shot_prompts(lm.tokenizer, args.prompts, args.few_shot)
    params = SamplingParams(temperature=0.0, max_tokens=args.new_tokens)
    engines = {
        share: LLMEngine(lm.model, lm.tokenizer, _engine_config(args, prompts, share))
        for share in (True, False)
    }
    engines[True].generate(prompts[:2], params)  # warm-up: first-call allocations
    seconds, tokens = {True: float("inf"), False: float("inf")}, {}
    for _ in range(args.repeats):
        for share, engine in engines.items():
            start = time.perf_counter()
            outs = engine.generate(prompts, params)
            seconds[share] = min(seconds[share], time.perf_counter() - start)
            tokens[share] = [o.token_ids for o in outs]
    lengths = [len(p) for p in prompts]
    report = {
        "config": {**vars(args), "threads": torch.get_num_threads()},
        "num_prompts": len(prompts),
        "prompt_tokens_median": statistics.median(lengths),
        "prefix_tokens": shared_prefix_tokens(prompts, args.page_size),
        "shared_s": seconds[True],
        "full_s": seconds[False],
        "ratio": seconds[False] / seconds[True],
        "same_tokens": sum(a == b for a, b in zip(tokens[True], tokens[False], strict=True)),
    }
    print(
        f"\nshared prefix vs full prefill: {args.model} {args.dtype}, {len(prompts)} prompts "
        f"(median {report['prompt_tokens_median']:.0f} tokens, shared prefix "
        f"{report['prefix_tokens']}), greedy, {args.new_tokens} new tokens, "
        f"{torch.get_num_threads()} threads, best of {args.repeats}"
    )
    print(f"  share_prefix on   {seconds[True]:8.2f} s")
    print(f"  share_prefix off  {seconds[False]:8.2f} s")
    print(f"  ratio (off / on)  {report['ratio']:8.2f}x")
    print(f"  same tokens       {report['same_tokens']} / {len(prompts)} completions")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


def few_shot_prompts(tokenizer, num_prompts: int, few_shot: int) -> list[list[int]]:
    """Token ids of the first `num_prompts` held-out few-shot arithmetic prompts."""
    tasks = generate_tasks(TaskConfig(few_shot=few_shot, num_heldout=num_prompts), "heldout")
    return [
        list(
            tokenizer.apply_chat_template(
                t["prompt"], add_generation_prompt=True, return_dict=True
            )["input_ids"]
        )
        for t in tasks
    ]


def _engine_config(args, prompts: list[list[int]], share: bool) -> EngineConfig:
    per_seq = -(-(max(len(p) for p in prompts) + args.new_tokens) // args.page_size)
    return EngineConfig(
        page_size=args.page_size,
        num_pages=min(len(prompts), args.max_batch_size) * per_seq + 8,
        max_batch_size=args.max_batch_size,
        dtype=args.dtype,
        linear_backend=args.linear_backend,
        share_prefix=share,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(prog="sparrow-bench prefix", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--device", default=None, help="default: CUDA when present, else the CPU")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on a CPU")
    p.add_argument("--prompts", type=at_least(1), default=200, help="held-out prompts")
    p.add_argument(
        "--few-shot", type=at_least(0), default=3, help="worked examples before each question"
    )
    p.add_argument("--new-tokens", type=at_least(1), default=40, help="greedy tokens per prompt")
    p.add_argument("--max-batch-size", type=at_least(1), default=64)
    p.add_argument("--page-size", type=at_least(1), default=16)
    p.add_argument("--linear-backend", default="torch", choices=["torch", "onednn"])
    p.add_argument(
        "--repeats", type=at_least(1), default=1, help="timed runs of each; the best is kept"
    )
    p.add_argument(
        "--threads", type=at_least(0), default=0, help="torch threads (0: torch's default)"
    )
    p.add_argument("--quick", action="store_true", help="16 prompts, 8 tokens: a smoke run")
    p.add_argument("--json", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    resolve_device_args(args)
    if args.quick:
        args.prompts, args.new_tokens = 16, 8
    return args
