"""`sparrow-bench speculative`: lossless speculative rollouts against dense and approximate
sparse decode, per context length.

    sparrow-bench speculative --json docs/speculative/bench.json   # SmolLM2, 2K-8K: minutes
    sparrow-bench speculative --quick                               # smoke run

For each `--contexts` length: one long prompt (rollout.py's arithmetic facts), `--batch`
samples sharing it, `--new-tokens` each at temperature 1. Three arms on one engine: dense (no
schedule), approximate sparse (a constant `--budget-tokens`) and speculative (that budget drafts
`--draft-tokens` k, a dense pass verifies), each k its own arm. Decode tokens/s (prefill
excluded: dense and identical everywhere), best of `--repeats`, interleaved; the realised
acceptance (accepted / drafted drafts), tokens per verify pass per sequence, and the best k per
context. The speculative arms' samples are the dense policy's: the ratio is a lossless speedup.
The runner's decode and verify calls are timed in the kept run of each arm, so the ratio is
explained from the same run: a draft step and a verify pass in dense-step units, and the speedup
they predict, tokens per verify / (draft steps per round x draft + verify), beside the measured
one (the rest of a round, sampling and the accept rule, is what the two leave out).
Exit 1 when a context's run skipped its work (a skipped measurement is no measurement): an arm
that decoded no token, a sparse arm whose steps all read every page (the budget covers the
context: the "sparse" arm was dense), or a speculative arm with no verify pass or no draft. Each
is named under the context's `problems` in the JSON.
"""

import argparse
import json
import time
from pathlib import Path

import torch

from sparrow.bench.device import load_bench_model, resolve_device_args
from sparrow.bench.rollout import long_prompt
from sparrow.cli.errors import ArgumentParser, at_least
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams
from sparrow.rollout.outputs import GenerateStats
from sparrow.rollout.speculative import SpeculativeConfig

QUICK = {"contexts": [256], "batch": 2, "new_tokens": 12, "budget_tokens": 64, "draft_tokens": [3]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    lm = load_bench_model(args)
    rows = [one_context(lm, args, context) for context in args.contexts]
    report = {"config": {**vars(args), "threads": torch.get_num_threads()}, "contexts": rows}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    problems = [f"context {r['context_tokens']}: {p}" for r in rows for p in r["problems"]]
    for problem in problems:
        print(f"error: {problem}")
    return 1 if problems else 0


def one_context(lm, args, context: int) -> dict:
    prompt = long_prompt(lm.tokenizer, context, args.seed)
    ps = args.page_size
    pages = -(-len(prompt) // ps) + args.batch * (-(-args.new_tokens // ps) + 2) + 8
    cfg = EngineConfig(
        page_size=ps,
        num_pages=pages,
        max_batch_size=args.batch,
        dtype=args.dtype,
        linear_backend=args.linear_backend,
        seed=args.seed,
    )
    budget = args.budget_tokens // ps
    sparse = lambda context_tokens: budget  # noqa: E731
    engines = {"dense": LLMEngine(lm.model, lm.tokenizer, cfg)}
    engines["sparse"] = LLMEngine(lm.model, lm.tokenizer, cfg, schedule=sparse)
    for k in args.draft_tokens:
        spec = SpeculativeConfig(enabled=True, draft_tokens=k)
        engines[f"spec_k{k}"] = LLMEngine(
            lm.model, lm.tokenizer, cfg, schedule=sparse, speculative=spec
        )
    params = SamplingParams(temperature=1.0, max_tokens=args.new_tokens, ignore_eos=True)
    tok_s = dict.fromkeys(engines, 0.0)
    stats = {name: GenerateStats() for name in engines}
    pages_read = dict.fromkeys(engines, 0)  # the most KV pages a step of the kept run read
    clocks = {name: RunnerClock(engine.runner) for name, engine in engines.items()}
    warm = SamplingParams(1.0, max_tokens=3, ignore_eos=True)
    for engine in engines.values():  # warm-up: allocator, thread pools, packed weights
        engine.generate([prompt[:64]], warm, n=args.batch)
    calls = {}
    for _ in range(args.repeats):  # interleaved, best of: the CPU may be shared
        for name, engine in engines.items():
            clocks[name].reset()
            outs = engine.generate([prompt], params, n=args.batch)
            if engine.last_stats.decode_tok_s > tok_s[name] or name not in calls:
                tok_s[name] = engine.last_stats.decode_tok_s
                stats[name], calls[name] = engine.last_stats, clocks[name].snapshot()
                pages_read[name] = _pages_read(outs, engine.last_stats, ps, name)
    row = {
        "context_tokens": len(prompt),
        "budget_tokens": budget * ps,
        "tok_s": tok_s,
        "vs_dense": {name: t / max(tok_s["dense"], 1e-9) for name, t in tok_s.items()},
        "acceptance": {},
        "tokens_per_verify": {},
        "step_ms": {name: _per_call_ms(c) for name, c in calls.items()},
        "cost": {},
        "problems": _skipped(tok_s, stats, pages_read, -(-len(prompt) // ps)),
    }
    if row["problems"]:  # the ratios below would describe work that was not done
        _print(row, args)
        return row
    dense_ms = row["step_ms"]["dense"]["decode"]
    for k in args.draft_tokens:
        name = f"spec_k{k}"
        s = stats[name]
        row["acceptance"][name] = s.spec_accepted / max(s.spec_drafted, 1)
        # Rounds count batches; each sequence of a round emits its accepted drafts plus one.
        tpv = s.decode_tokens / max(s.spec_rounds * args.batch, 1)
        row["tokens_per_verify"][name] = tpv
        draft, verify = row["step_ms"][name]["decode"], row["step_ms"][name]["verify"]
        steps = calls[name]["decode"][1] / max(calls[name]["verify"][1], 1)  # drafts per round
        row["cost"][name] = {
            "draft_steps_per_round": steps,
            "draft_in_dense_steps": draft / dense_ms,
            "verify_in_dense_steps": verify / dense_ms,
            "predicted_vs_dense": tpv / (steps * draft / dense_ms + verify / dense_ms),
        }
    row["cost"]["sparse_in_dense_steps"] = row["step_ms"]["sparse"]["decode"] / dense_ms
    spec_arms = [f"spec_k{k}" for k in args.draft_tokens]
    row["best_k"] = int(max(spec_arms, key=tok_s.__getitem__).removeprefix("spec_k"))
    _print(row, args)
    return row


def _pages_read(outs, stats, page_size: int, name: str) -> int:
    """The most KV pages one decode step of the run read: the emitted tokens' or, for a
    speculative arm (it emits the dense pass's tokens), its drafts' (a None budget: dense)."""
    if not name.startswith("spec_"):  # the first token is the (dense) prefill's
        return max((int(b) for o in outs for b in o.budget_pages[1:]), default=0)
    drafts = stats.spec_accept
    pages = [-(-pos // page_size) for pos in drafts.positions]
    return max(
        (p if b is None else min(b, p) for p, b in zip(pages, drafts.budget_pages, strict=True)),
        default=0,
    )


def _skipped(tok_s: dict, stats: dict, pages_read: dict, prompt_pages: int) -> list:
    """What each arm's kept run left undone, in words; [] when every arm did its work."""
    problems = [f"{name}: decoded no token" for name, t in tok_s.items() if t <= 0]
    for name in tok_s:
        sparse = name != "dense"  # the sparse arm and the speculative arms' drafts
        if sparse and pages_read[name] >= prompt_pages:
            problems.append(
                f"{name}: every step read all pages ({pages_read[name]} of a {prompt_pages}-page "
                "prompt): the budget covers the context, nothing was sparse"
            )
        if name.startswith("spec_") and (
            stats[name].spec_rounds == 0 or stats[name].spec_drafted == 0
        ):
            problems.append(f"{name}: no draft was verified (rounds {stats[name].spec_rounds})")
    return problems


class RunnerClock:
    """Seconds and calls of a model runner's `decode` and `verify` (its bound methods wrapped
    on the instance): a speculative round's draft steps and dense pass, apart."""

    def __init__(self, runner):
        self.totals: dict[str, list[float]] = {}
        for name in ("decode", "verify"):
            setattr(runner, name, self._timed(name, getattr(runner, name)))
        self.reset()

    def _timed(self, name: str, method):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = method(*args, **kwargs)
            total = self.totals[name]
            total[0] += time.perf_counter() - start
            total[1] += 1
            return out

        return timed

    def reset(self) -> None:
        self.totals = {"decode": [0.0, 0], "verify": [0.0, 0]}

    def snapshot(self) -> dict[str, tuple[float, int]]:
        return {name: (t[0], int(t[1])) for name, t in self.totals.items()}


def _per_call_ms(calls: dict[str, tuple[float, int]]) -> dict[str, float]:
    return {name: 1e3 * s / n if n else 0.0 for name, (s, n) in calls.items()}


def _print(row: dict, args) -> None:
    print(
        f"\ncontext {row['context_tokens']} tokens, batch {args.batch} (one shared prompt), "
        f"{args.new_tokens} new tokens, budget {row['budget_tokens']} tokens"
    )
    for problem in row["problems"]:
        print(f"  skipped: {problem}")
    if row["problems"]:
        return
    for name, t in row["tok_s"].items():
        extra = f"  step {row['step_ms'][name]['decode']:.1f} ms"
        if name in row["acceptance"]:
            cost = row["cost"][name]
            extra = (
                f"  acceptance {row['acceptance'][name]:.3f}, "
                f"{row['tokens_per_verify'][name]:.2f} tokens per verify; "
                f"{cost['draft_steps_per_round']:.2f} drafts of "
                f"{cost['draft_in_dense_steps']:.2f} + verify "
                f"{cost['verify_in_dense_steps']:.2f} dense steps: predicts "
                f"{cost['predicted_vs_dense']:.2f}x"
            )
        print(f"  {name:9s} {t:9.1f} tok/s  {row['vs_dense'][name]:5.2f}x dense{extra}")
    print(f"  best k: {row['best_k']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(prog="sparrow-bench speculative", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--device", default=None, help="default: CUDA when present, else the CPU")
    p.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on a CPU")
    p.add_argument(
        "--contexts",
        type=at_least(1),
        nargs="+",
        default=[2048, 4096, 6144, 8000],
        help="prompt lengths in tokens (SmolLM2's limit is 8,192 positions)",
    )
    p.add_argument("--batch", type=at_least(1), default=4, help="samples of the prompt")
    p.add_argument("--new-tokens", type=at_least(1), default=64)
    p.add_argument("--budget-tokens", type=at_least(1), default=512, help="draft budget (tokens)")
    p.add_argument("--draft-tokens", type=at_least(1), nargs="+", default=[2, 4, 6, 8], help="k")
    p.add_argument("--page-size", type=at_least(1), default=16)
    p.add_argument("--linear-backend", default="onednn", choices=["torch", "onednn"])
    p.add_argument("--repeats", type=at_least(1), default=2, help="timed runs; the best is kept")
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
