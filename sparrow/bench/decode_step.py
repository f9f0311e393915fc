"""`sparrow-bench decode-step`: one whole-model decode step, sparse against dense, as the engine
runs it (embedding to sampled token, every layer), at a given model shape, context, budget and
batch.

    sparrow-bench decode-step --json runs/decode_step.json   # GPU: Qwen3-1.7B shape, 32K context,
                                                            # 2K-token budget, batch 16 and 64
    sparrow-bench decode-step                               # CPU: a tiny shape, wall clock

The step is the engine's own: `LLMEngine` builds the model runner from an `EngineConfig` (decode
plan, paged KV cache, Triton kernels on CUDA, CUDA-graph replay per step shape when
`--graphs` is on), and one step is `runner.decode` (plan update + forward) then the engine's
sampler; the sampled tokens are read back and appended after the timed window, as generate
does. Random weights of the model's real shape are made directly on the device
(sparrow.models.random_init's shapes; no download). The batch is GRPO-like: `--samples` samples
of each of batch / samples prompts, which share their prompt's full KV pages as in generate (at
Qwen3-1.7B one token's K/V is 112 KiB, so 64 distinct 32K contexts would need 224 GiB). The
pages hold random K/V with up-to-date page summaries instead of a prefill's: a step's work does
not depend on the values, and 8 prefills of 32K tokens would cost more than all the steps.

Per batch and graphs setting, the sparse step (every row at `--budget-tokens`, layers 0-1 dense)
and the dense step are each run `--warmup` times (Triton compiles, graphs are captured), then
timed `--iters` times: CUDA events on a GPU (the median is the figure), the wall clock on a
CPU. Every step of a batch has one page-table width (the decode plan's `min_columns`: the width
the longest row reaches by the batch's last step), so the warm-up meets every Triton
specialisation and graph shape the timed steps do, and no JIT compile lands in a timed step
(counted: `jit_compiles_timed`, jit_compiles.py). On a GPU the host share of the step (the part
the GPU spent waiting for the host between launches, step_timer.py) comes from
`--profile-steps` profiled steps per configuration, in a pass of their own after every
configuration was timed and every graph captured: a profiler session never sits between two
captures. `--compile-only` runs the warm-up alone (a GPU check's first part: the Triton cache
is then warm for the timed run). The JSON holds every step time, the sparse/dense ratio, the
shapes and the KV bytes (pool, held, read per step). Exits non-zero when a configuration did not
run as asked (no timed step, graphs asked for and not replayed, a compile in a timed step).
"""

import argparse
import functools
import importlib
import os
import time
import traceback
from dataclasses import dataclass, field

import torch
import transformers

from sparrow.bench.decode_step_args import parse_args
from sparrow.bench.decode_step_report import print_profile, print_row, problems
from sparrow.bench.decode_step_spec import speculative_row, time_verify
from sparrow.bench.jit_compiles import CompileWatch
from sparrow.bench.random_runner import RandomWeights
from sparrow.bench.step_timer import StepTimer, host_share, summary
from sparrow.bench.trainer_args import write_json
from sparrow.models.random_init import random_model_config
from sparrow.rollout.block_manager import BlockManager
from sparrow.rollout.engine import EngineConfig, LLMEngine
from sparrow.rollout.sequence import Sequence

# The Triton kernels' modules (sparrow/kernels), watched for compiles when the engine uses them.
TRITON_MODULES = ("decode_triton", "score_triton", "select_triton", "norm_rope_triton",
                  "swiglu_triton", "kv_write_triton")  # fmt: skip


@dataclass
class Bench:
    """What every configuration shares: the engine (weights, KV pool, graphs) and its shapes."""

    engine: LLMEngine
    config: transformers.PretrainedConfig  # the HF config of the model shape
    device: torch.device
    dtype: torch.dtype
    page_size: int
    weights_bytes: int  # every weight, read once per decode step
    kernel_modules: list  # the Triton kernels' modules when the engine launches them, else []
    budget_pages: int = 0  # sparse rows' budget
    next_seq_id: int = 0
    jit_seen: set = field(default_factory=set)  # interpreter: specialisations met (CompileWatch)


def build(args: argparse.Namespace) -> Bench:
    """The engine on `args.device`, with a KV pool for the largest batch; no step run yet."""
    config = random_model_config(args.model)
    config.max_position_embeddings = max(config.max_position_embeddings, args.context + 1024)
    dtype = getattr(torch, args.dtype)
    weights = RandomWeights(config, seed=0, device=args.device, dtype=dtype)
    cfg = EngineConfig(
        page_size=args.page_size,
        num_pages=pool_pages(args),
        max_batch_size=max(args.batches),
        dtype=args.dtype,
        linear_backend="torch",
        backend=args.backend,
        cuda_graphs=args.device.type == "cuda" and True in args.graphs,
    )
    weights_bytes = sum(t.numel() * t.element_size() for t in weights.parameters())
    engine = LLMEngine(weights, None, cfg)  # copies the weights: the random ones can go
    triton = args.device.type == "cuda" or (
        args.backend == "triton" and os.environ.get("TRITON_INTERPRET") == "1"
    )
    modules = [importlib.import_module(f"sparrow.kernels.{m}") for m in TRITON_MODULES]
    return Bench(engine, config, args.device, dtype, args.page_size, weights_bytes,
                 modules if triton else [], args.budget_tokens // args.page_size)  # fmt: skip


def final_pages(args: argparse.Namespace) -> int:
    """Pages of the longest row at a batch's last step (timed run or profiling pass): the
    plan's fixed page-table width for the batch."""
    steps = len(args.graphs) * 2 * (max(1, args.warmup) + args.iters + args.profile_steps) + 1
    return -(-(args.context + steps) // args.page_size)


def pool_pages(args: argparse.Namespace) -> int:
    """KV pages for the largest batch: its prompts' shared pages, and per sample its partial
    page plus room for every token the steps append."""
    ps = args.page_size
    steps = len(args.graphs) * 2 * (args.warmup + args.iters + args.profile_steps + 3)
    steps += args.speculative_k  # a verify pass's drafts, taken back after it
    per_sample = 1 + -(-(steps + 1) // ps) + 1
    return max(b // args.samples * (args.context // ps) + b * per_sample for b in args.batches)


def sequences(bench: Bench, batch: int, samples: int, context: int) -> tuple[list, BlockManager]:
    """`batch` sequences of `context` tokens (batch / samples prompts, their samples sharing the
    prompt's full pages), their cached tokens filled with random K/V and summaries, each with
    one sampled token to feed: ready for a decode step."""
    runner, ps = bench.engine.runner, bench.page_size
    bm = BlockManager(runner.kv.num_pages - 1, ps)  # the pool less the plan's scratch page
    gen = torch.Generator().manual_seed(batch)  # host token ids
    seqs = []
    for prompt_index in range(batch // samples):
        prompt = torch.randint(3, bench.config.vocab_size, (context - 1,), generator=gen).tolist()
        group = []
        for _ in range(samples):
            group.append(Sequence(bench.next_seq_id, prompt_index, prompt, max_tokens=1 << 20))
            bench.next_seq_id += 1  # unique across configurations: dense K/V copies key on ids
        bm.allocate_prefill(group)
        seqs += group
    fill_random_kv(bench, seqs)
    first = torch.randint(3, bench.config.vocab_size, (batch,), generator=gen).tolist()
    append(seqs, bm, first)  # the tokens a prefill would have sampled
    return seqs, bm


def append(seqs: list[Sequence], bm: BlockManager, tokens: list[int]) -> None:
    """Each sequence's sampled token appended, and a page given where it starts one."""
    for seq, token in zip(seqs, tokens, strict=True):
        seq.completion_ids.append(token)
        if bm.needs_page(seq):
            bm.append_page(seq)


def fill_random_kv(bench: Bench, seqs: list[Sequence]) -> None:
    """Random K/V in every page and the summaries of the pages the sequences hold, refreshed as
    a prefill refreshes them (the engine's own update)."""
    kv, ps = bench.engine.runner.kv, bench.page_size
    kv.k.normal_()
    kv.v.normal_()
    fills: dict[int, int] = {}
    for seq in seqs:
        for i, page in enumerate(seq.page_table):
            fills[page] = min(ps, seq.num_tokens - i * ps)
    pages = torch.tensor(list(fills), dtype=torch.int64, device=bench.device)
    counts = torch.tensor(list(fills.values()), dtype=torch.int64, device=bench.device)
    kv.update_summaries(pages, counts)
    if kv.dense_copy is not None:
        kv.dense_copy.invalidate()


def measure(bench: Bench, args, seqs: list[Sequence], bm: BlockManager, sparse: bool, graphs: bool,
            timed: bool = True) -> dict:  # fmt: skip
    """Warm-up, then `args.iters` timed steps of one arm (`timed`=False: the warm-up alone)."""
    runner = bench.engine.runner
    timer = StepTimer(bench.device)
    step = _stepper(bench, seqs, bm, sparse)
    watch = CompileWatch(bench.kernel_modules, bench.jit_seen)
    with eager_unless(runner, graphs), watch:
        replayed = runner.graphs.num_replayed if runner.graphs is not None else 0
        captured = runner.graphs.num_captured if runner.graphs is not None else 0
        advance(step, seqs, bm, max(1, args.warmup))
        warm = watch.count
        times = []
        for _ in range(args.iters if timed else 0):
            ms, tokens = timer.time(step)
            times.append(ms)
            append(seqs, bm, tokens.tolist())
        compiled_timed = watch.count - warm
        graph_counts = (0, 0) if runner.graphs is None else (
            runner.graphs.num_replayed - replayed, runner.graphs.num_captured - captured
        )  # fmt: skip
    result = summary(times) if times else {"steps_ms": []}
    return result | {
        "graph_replays": graph_counts[0],
        "graph_captures": graph_counts[1],
        "jit_compiles_warmup": warm if watch.counting else None,
        "jit_compiles_timed": compiled_timed if watch.counting else None,
        "context_tokens_at_end": max(s.num_tokens for s in seqs),
        "kernel_ms": None,  # the profiling pass fills these
        "device_events_per_step": 0.0,
        "host_share": None,
    }


def _stepper(bench: Bench, seqs: list[Sequence], bm: BlockManager, sparse: bool):
    """One decode step of `seqs` (sparse: every row at the budget), returning the (B,) sampled
    token ids on the device; the caller appends them."""
    engine, runner = bench.engine, bench.engine.runner
    budgets = [bench.budget_pages] * len(seqs) if sparse else None

    def step() -> torch.Tensor:
        # Summaries refreshed on sparse steps only, as generate does (with a schedule set).
        logits = runner.decode(seqs, budgets, update_summaries=sparse)
        return engine.sampler(logits, temperature=1.0).token_ids

    return step


def advance(step, seqs: list[Sequence], bm: BlockManager, n: int) -> None:
    """`n` untimed steps, each one's tokens appended."""
    for _ in range(n):
        append(seqs, bm, step().tolist())


def profile_pass(bench: Bench, args, report: dict) -> None:
    """The host share of every configuration timed: `args.profile_steps` profiled steps each,
    on fresh sequences of the batch (same shapes: the graphs captured for the timed steps
    replay), after every timed step and capture of the run. A capture here is a problem."""
    runner = bench.engine.runner
    timer = StepTimer(bench.device)
    for batch in args.batches:
        rows = [r for r in report["runs"] if r["batch"] == batch]
        if not rows:
            continue
        seqs, bm = sequences(bench, batch, args.samples, args.context)
        for row in rows:
            for arm in ("sparse", "dense"):
                step = _stepper(bench, seqs, bm, arm == "sparse")
                steps = functools.partial(advance, step, seqs, bm, args.profile_steps)
                with eager_unless(runner, row["graphs"]):
                    captured = runner.graphs.num_captured if runner.graphs is not None else 0
                    # At least one kernel per layer, or the profiler missed the graph's kernels.
                    kernel_ms, events = timer.kernel_ms(
                        steps, args.profile_steps, bench.config.num_hidden_layers
                    )
                    if runner.graphs is not None and runner.graphs.num_captured > captured:
                        report["errors"].append({"batch": batch, "error": "a CUDA graph was "
                                                 "captured inside the profiling pass"})  # fmt: skip
                r = row[arm]
                r |= {"kernel_ms": kernel_ms, "device_events_per_step": events}
                r["host_share"] = host_share(r["step_ms"], kernel_ms)
        print_profile(rows)


class eager_unless:
    """The runner decoding eagerly with unpadded shapes (as built with cuda_graphs=False) unless
    `graphs`; restored on exit."""

    def __init__(self, runner, graphs: bool):
        self.runner, self.graphs = runner, graphs

    def __enter__(self):
        self.saved = self.runner.graphs, self.runner.plan.pad_shapes
        if not self.graphs:
            self.runner.graphs, self.runner.plan.pad_shapes = None, False

    def __exit__(self, *exc):
        self.runner.graphs, self.runner.plan.pad_shapes = self.saved


def kv_bytes(bench: Bench, args, batch: int, held_pages: int = 0) -> dict:
    """Bytes of K/V: per token (all layers), the pool, what the batch holds (`held_pages`, each
    shared page once), and what one step reads (every row its own pages, shared ones included;
    sparse: layers 0-1 whole, the others the budget, plus the page summaries scoring reads)."""
    c, kv = bench.config, bench.engine.runner.kv
    elem = torch.empty(0, dtype=bench.dtype).element_size()
    per_layer_token = 2 * c.num_key_value_heads * c.head_dim * elem
    layers = c.num_hidden_layers
    dense_layers = len(bench.engine.sparse_settings.dense_layers)
    pages = args.context // bench.page_size
    summary_tables = 1 if bench.engine.sparse_settings.score == "centroid" else 2
    last = kv.summaries[-1]
    assert last is not None, "a sparse layer keeps its page summary"
    summary_elem = last.tables[0].element_size()
    summaries = pages * summary_tables * c.num_key_value_heads * c.head_dim * summary_elem
    sparse_tokens = dense_layers * args.context + (layers - dense_layers) * args.budget_tokens
    return {
        "per_token": layers * per_layer_token,
        "pool": 2 * kv.k.numel() * elem,
        "held": held_pages * bench.page_size * layers * per_layer_token,
        "read_per_step_dense": batch * args.context * layers * per_layer_token,
        "read_per_step_sparse": batch
        * (sparse_tokens * per_layer_token + (layers - dense_layers) * summaries),
    }


def run(bench: Bench, args, batch: int, timed: bool = True) -> list[dict]:
    """Both arms at each graphs setting for one batch (its sequences made once, every step at
    one page-table width)."""
    bench.engine.runner.plan.min_columns = final_pages(args)
    seqs, bm = sequences(bench, batch, args.samples, args.context)
    held = len({page for seq in seqs for page in seq.page_table})  # shared pages once
    rows = []
    # The speculative arm's verify pass (eager, whatever the graphs setting), once per batch.
    verify = time_verify(bench, args, seqs, bm, timed) if args.speculative_k else None
    for graphs in args.graphs:
        sparse = measure(bench, args, seqs, bm, sparse=True, graphs=graphs, timed=timed)
        dense = measure(bench, args, seqs, bm, sparse=False, graphs=graphs, timed=timed)
        if not timed:
            rows.append({"batch": batch, "graphs": graphs, "sparse": sparse, "dense": dense})
            continue
        rows.append({
            "batch": batch, "prompts": batch // args.samples, "samples": args.samples,
            "graphs": graphs, "sparse": sparse, "dense": dense,
            "ratio": dense["step_ms"] / sparse["step_ms"],
            "kv_bytes": kv_bytes(bench, args, batch, held),
        })  # fmt: skip
        if verify is not None and verify["steps_ms"]:
            rows[-1]["speculative"] = speculative_row(verify, sparse["step_ms"], dense["step_ms"])
        print_row(rows[-1])
    return rows


def compile_only(args) -> int:
    """Every configuration's warm-up and nothing else: the Triton variants and graph shapes the
    timed run meets, compiled (into Triton's cache) and captured; the JSON says what and how
    long."""
    start = time.perf_counter()
    bench = build(args)
    report = {"bench": "decode-step", "compile_only": True, "batches": args.batches,
              "graphs": args.graphs, "runs": [], "errors": []}  # fmt: skip
    for batch in args.batches:
        try:
            report["runs"] += run(bench, args, batch, timed=False)
        except Exception as err:
            print(f"batch {batch} failed: {traceback.format_exc(limit=-3)}", flush=True)
            report["errors"].append({"batch": batch, "error": f"{type(err).__name__}: {err}"})
    graphs = bench.engine.runner.graphs
    counts = [r[arm]["jit_compiles_warmup"] for r in report["runs"] for arm in ("sparse", "dense")]
    report |= {
        "jit_compiles": None if None in counts else sum(counts),
        "graph_captures": graphs.num_captured if graphs is not None else 0,
        "seconds": round(time.perf_counter() - start, 1),
    }
    write_json(args.json, report, announce=False)
    print(
        f"decode-step --compile-only: {report['jit_compiles']} Triton compiles, "
        f"{report['graph_captures']} graph captures, {report['seconds']} s",
        flush=True,
    )
    for e in report["errors"]:
        print(f"sparrow-bench decode-step: batch {e['batch']}: {e['error']}")
    return 1 if report["errors"] else 0


def report_header(args, bench: Bench) -> dict:
    """The report's description of the run (device, model shape, sparse settings, what is
    timed); main adds the runs, their errors and the checks."""
    c = bench.config
    return {
        "bench": "decode-step",
        "device": torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu",
        "device_type": args.device.type,
        "timer": StepTimer(args.device).clock,
        "model": {
            "name": args.model,
            "layers": c.num_hidden_layers,
            "hidden": c.hidden_size,
            "q_heads": c.num_attention_heads,
            "kv_heads": c.num_key_value_heads,
            "head_dim": c.head_dim,
            "intermediate": c.intermediate_size,
            "vocab": c.vocab_size,
        },  # fmt: skip
        "dtype": args.dtype,
        "context_tokens": args.context,
        "budget_tokens": args.budget_tokens,
        "budget_pages": args.budget_tokens // args.page_size,
        "page_size": args.page_size,
        "dense_layers": list(bench.engine.sparse_settings.dense_layers),
        "score": bench.engine.sparse_settings.score,
        "batches": args.batches,
        "graphs": args.graphs,
        "iters": args.iters,
        "warmup": args.warmup,
        "profile_steps": args.profile_steps,
        "speculative_k": args.speculative_k,
        "page_columns": final_pages(args),
        "weights_bytes": bench.weights_bytes,
        "kv_bytes_per_token": kv_bytes(bench, args, 1)["per_token"],
        "kv_pool_bytes": kv_bytes(bench, args, 1)["pool"],
        "runs": [],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.compile_only:
        return compile_only(args)
    bench = build(args)
    report = report_header(args, bench)
    print(
        f"decode step, {args.model} {args.dtype} on {report['device']}: context {args.context}, "
        f"budget {args.budget_tokens} tokens, {report['timer']}, median of {args.iters}"
    )
    report["errors"] = []
    for batch in args.batches:
        try:
            report["runs"] += run(bench, args, batch)
        except Exception as err:  # the next batch still runs: one GPU call, as much as it gives
            tail = traceback.format_exc(limit=-3)
            report["errors"].append({"batch": batch, "error": f"{type(err).__name__}: {err}"})
            print(f"batch {batch} failed: {tail}", flush=True)
        write_json(args.json, report, announce=False)  # what ran survives a later failure
    if args.profile_steps > 0 and bench.device.type == "cuda":
        try:  # after every timed configuration and capture
            profile_pass(bench, args, report)
        except Exception as err:
            print(f"profiling pass failed: {traceback.format_exc(limit=-3)}", flush=True)
            report["errors"].append({"batch": None, "error": f"profiling: {err}"})
    report["ratio"] = {
        f"batch {r['batch']}, graphs {'on' if r['graphs'] else 'off'}": r["ratio"]
        for r in report["runs"]
    }
    report["problems"] = problems(report)
    write_json(args.json, report, announce=False)
    for line in report["problems"]:
        print(f"sparrow-bench decode-step: {line}")
    return 1 if report["problems"] else 0
