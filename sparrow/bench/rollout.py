"""`sparrow-bench rollout`: the engine against HF generate, and sparse against dense decode.

    sparrow-bench rollout --json runs/bench_rollout.json   # full size: minutes on 2 CPU cores
    sparrow-bench rollout --quick                           # smoke run: well under a minute

1. Engine vs HF `generate`: the same model, `--batch` prompts of `--prompt-tokens` tokens,
   `--new-tokens` sampled at temperature 1 with EOS ignored (HF: min_new_tokens), no top-k/top-p.
   tokens/s = batch * new tokens / wall time, prefill included, for both. The engine runs with
   both GEMM backends (torch: HF's GEMMs; onednn: pre-packed weights, the CPU throughput mode);
   the JSON's engine_tok_s is `--linear-backend`'s.
2. Sparse vs dense decode: one long prompt of `--context` tokens (arithmetic facts in a chat
   turn), `--sparse-batch` samples sharing it, `--sparse-new-tokens` each; decode tokens/s
   (prefill excluded: it is dense and identical in both runs) with no schedule vs a constant
   budget of `--budget-tokens`. `--distinct-prompts`: one prompt per sample instead (contexts
   shared by no one, as in long chains of thought; the dense layers then keep contiguous K/V
   copies, which a shared prompt would multiply past the pool's size). The sparse run's tokens
   are then teacher-forced through the dense and the sparse engine, and the exact
   full-vocabulary acceptance a_t = sum_v min(p, q) gives its p5 over all generated tokens.
"""

import argparse
import json
import random
import time
from pathlib import Path

import torch

from sparrow import malloc
from sparrow.bench.device import load_bench_model, resolve_device_args
from sparrow.cli.errors import ArgumentParser, at_least
from sparrow.control.acceptance import exact_acceptance
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams

QUICK = {
    "batch": 4,
    "prompt_tokens": 32,
    "new_tokens": 16,
    "context": 512,
    "sparse_batch": 2,
    "sparse_new_tokens": 16,
    "budget_tokens": 128,
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lm = load_bench_model(args)
    report = {
        "config": {
            **vars(args),
            "threads": torch.get_num_threads(),
            "cpu_allocator_tuned": malloc.tuned,
        },
        "engine_vs_hf": engine_vs_hf(lm, args),
        "sparse_vs_dense": sparse_vs_dense(lm, args),
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


def engine_vs_hf(lm, args) -> dict:
    model, vocab = lm.model, lm.model.config.vocab_size
    rng = random.Random(args.seed)
    prompts = [
        [rng.randrange(100, vocab) for _ in range(args.prompt_tokens)] for _ in range(args.batch)
    ]
    pages = args.batch * -(-(args.prompt_tokens + args.new_tokens) // args.page_size) + 8
    # Both GEMM backends: "torch" matches HF's GEMMs, "onednn" is the CPU throughput mode.
    backends = list(dict.fromkeys([args.linear_backend, "torch"]))
    engines = {
        b: LLMEngine(model, lm.tokenizer, _engine_config(args, pages, args.batch, b))
        for b in backends
    }
    params = SamplingParams(temperature=1.0, max_tokens=args.new_tokens, ignore_eos=True)
    input_ids = torch.tensor(prompts, device=args.device)  # (B, T)
    pad = lm.tokenizer.pad_token_id

    def run_hf(new_tokens: int) -> None:
        with torch.inference_mode():
            model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=pad,
            )

    warm = SamplingParams(1.0, max_tokens=2, ignore_eos=True)
    for engine in engines.values():  # warm-up: allocator, thread pools, packed weights
        engine.generate(prompts, warm)
    run_hf(2)
    engine_s = dict.fromkeys(backends, float("inf"))
    hf_s = float("inf")
    for _ in range(args.repeats):  # interleaved, best of: the CPU may be shared
        for b, engine in engines.items():
            engine_s[b] = min(engine_s[b], _timed(lambda e=engine: e.generate(prompts, params)))
        hf_s = min(hf_s, _timed(lambda: run_hf(args.new_tokens)))
    tokens = args.batch * args.new_tokens
    main_s = engine_s[args.linear_backend]
    result = {
        "engine_tok_s": tokens / main_s,
        "hf_tok_s": tokens / hf_s,
        "ratio": hf_s / main_s,
        "linear_backend": args.linear_backend,
        "engine_tok_s_by_linear_backend": {b: tokens / t for b, t in engine_s.items()},
    }
    print(
        f"\nengine vs HF generate: {args.model} {args.dtype}, batch {args.batch}, prompt "
        f"{args.prompt_tokens}, {args.new_tokens} new tokens, {torch.get_num_threads()} threads"
    )
    for b, t in engine_s.items():
        print(f"  engine ({b} GEMMs) {tokens / t:9.1f} tok/s  ({t:.2f} s)  {hf_s / t:5.2f}x HF")
    print(f"  HF generate        {tokens / hf_s:9.1f} tok/s  ({hf_s:.2f} s)")
    return result


def sparse_vs_dense(lm, args) -> dict:
    batch = args.sparse_batch
    ps = args.page_size
    budget_pages = args.budget_tokens // ps
    if args.distinct_prompts:
        prompts = [long_prompt(lm.tokenizer, args.context, args.seed + i) for i in range(batch)]
        n = 1
    else:  # the samples of one prompt, sharing its full pages
        prompts, n = [long_prompt(lm.tokenizer, args.context, args.seed)], batch
    prompt_pages = sum(-(-len(p) // ps) for p in prompts)
    pages = prompt_pages + batch * (-(-args.sparse_new_tokens // ps) + 1) + 8
    cfg = _engine_config(args, pages, batch, args.linear_backend)
    engine = LLMEngine(lm.model, lm.tokenizer, cfg)
    params = SamplingParams(temperature=1.0, max_tokens=args.sparse_new_tokens, ignore_eos=True)
    sparse_schedule = lambda context_tokens: budget_pages  # noqa: E731

    dense_tok_s, sparse_tok_s, outputs = 0.0, 0.0, []
    for _ in range(args.repeats):
        engine.set_schedule(None)
        engine.generate(prompts, params, n=n)
        dense_tok_s = max(dense_tok_s, engine.last_stats.decode_tok_s)
        engine.set_schedule(sparse_schedule)
        outputs = engine.generate(prompts, params, n=n)
        sparse_tok_s = max(sparse_tok_s, engine.last_stats.decode_tok_s)

    completions = [o.token_ids for o in outputs]
    scored = [prompts[o.prompt_index] for o in outputs]
    sparse_logits = engine.score(scored, completions)
    engine.set_schedule(None)
    dense_logits = engine.score(scored, completions)
    acc = torch.cat(
        [
            exact_acceptance(d.log_softmax(-1), s.log_softmax(-1))
            for d, s in zip(dense_logits, sparse_logits, strict=True)
        ]
    )
    result = {
        "context_tokens": len(prompts[0]),
        "distinct_prompts": args.distinct_prompts,
        "budget_tokens": budget_pages * ps,
        "sparse_tok_s": sparse_tok_s,
        "dense_tok_s": dense_tok_s,
        "ratio": sparse_tok_s / dense_tok_s,
        "p5_acceptance": torch.quantile(acc, 0.05).item(),
    }
    print(
        f"\nsparse vs dense decode: context {len(prompts[0])} tokens, batch {batch} "
        f"({'distinct prompts' if args.distinct_prompts else 'one shared prompt'}), "
        f"{args.sparse_new_tokens} new tokens, budget {budget_pages} pages ({budget_pages * ps} "
        f"tokens), {args.score} score, layers {tuple(cfg.dense_layers)} dense"
    )
    print(f"  dense   {dense_tok_s:9.1f} tok/s (decode)")
    print(f"  sparse  {sparse_tok_s:9.1f} tok/s (decode)")
    print(f"  ratio   {result['ratio']:9.2f}x")
    print(
        f"  sparse acceptance: p5 {result['p5_acceptance']:.3f}, mean {acc.mean().item():.3f}, "
        f"min {acc.min().item():.3f} over {acc.numel()} tokens"
    )
    return result


def long_prompt(tokenizer, num_tokens: int, seed: int) -> list[int]:
    """A chat turn of about `num_tokens` tokens: arithmetic facts, then a question about one."""
    rng = random.Random(seed)
    facts = []
    while True:
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        facts.append(f"{a} + {b} = {a + b}.")
        text = "Here are some facts.\n" + " ".join(facts)
        if len(tokenizer(text)["input_ids"]) >= num_tokens - 40:
            break
    question = f"{text}\nWhat is {facts[len(facts) // 3].split(' =')[0]}? Explain step by step."
    messages = [{"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    return list(ids["input_ids"])


def _engine_config(args, num_pages: int, max_batch_size: int, linear: str) -> EngineConfig:
    return EngineConfig(
        page_size=args.page_size,
        num_pages=num_pages,
        max_batch_size=max_batch_size,
        score=args.score,
        dtype=args.dtype,
        linear_backend=linear,
        seed=args.seed,
    )


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(prog="sparrow-bench rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--device", default=None, help="default: CUDA when present, else the CPU")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on a CPU")
    p.add_argument("--batch", type=at_least(1), default=16, help="engine vs HF: prompts")
    p.add_argument(
        "--prompt-tokens", type=at_least(1), default=64, help="engine vs HF: prompt length"
    )
    p.add_argument(
        "--new-tokens", type=at_least(1), default=256, help="engine vs HF: tokens per prompt"
    )
    p.add_argument(
        "--context", type=at_least(1), default=4096, help="sparse vs dense: prompt tokens"
    )
    p.add_argument("--sparse-batch", type=at_least(1), default=8, help="sparse vs dense: samples")
    p.add_argument("--sparse-new-tokens", type=at_least(1), default=128)
    p.add_argument(
        "--distinct-prompts",
        action="store_true",
        help="sparse vs dense: a prompt per sample instead of samples sharing one",
    )
    p.add_argument("--budget-tokens", type=at_least(1), default=512, help="sparse budget (tokens)")
    p.add_argument("--score", default="quest", choices=["quest", "centroid"])
    p.add_argument("--page-size", type=at_least(1), default=16)
    p.add_argument(
        "--linear-backend",
        default="onednn",
        choices=["torch", "onednn"],
        help="engine GEMMs reported in the JSON (the table shows torch as well)",
    )
    p.add_argument("--repeats", type=at_least(1), default=1, help="timed runs; the best is kept")
    p.add_argument(
        "--threads", type=at_least(0), default=0, help="torch threads (0: torch's default)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="reduced sizes: a smoke run")
    p.add_argument("--json", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    resolve_device_args(args)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    return args
