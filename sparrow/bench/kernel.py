"""Kernel benchmark: one layer's block-sparse decode (page selection + sparse attention) against
dense paged decode, over context lengths x budgets.

    sparrow-bench kernel                       # CPU: SmolLM2-like small shapes (auto: the C++
                                               # kernel when it builds; --backend torch: torch ops)
    sparrow-bench kernel --json out.json       # a list of rows, one per (context, budget)
    sparrow-bench kernel --sweep               # GPU: also time a few Triton tile configs
    sparrow-bench kernel --aot --json aot.json  # no GPU needed: compile every Triton variant
                                               # for Hopper; regs, spills, smem per variant

On the cpp backend selection and attention are one fused call: select_ms and sparse_decode_ms are
null, sparse_ms times the call; dense_ms is the torch paged decode (gather + SDPA) there.
Bytes read count what each path must read: dense, every K/V token; sparse, the selected pages'
K/V plus the page summaries that scoring reads (centroid, or min and max for Quest; in the cache
dtype on the Triton path, fp32 elsewhere). On a GPU
the achieved fraction of HBM bandwidth is reported against --peak-tbps (default from the device
name: 4.8 TB/s for an H200). Goals from issue 3, checked at the end on GPU: dense >= 75% of HBM
bandwidth at the longest context, sparse decode >= 65% on its bytes, and per layer
sparse_ms <= 1.3 x (budget / context + 1/16) x dense_ms.
"""

import argparse
import functools
import json
import os
import time
from pathlib import Path

import torch

from sparrow.bench.device import bench_device, seeded
from sparrow.bench.kernel_configs import DTYPES, SWEEP, default_shape
from sparrow.cli.errors import ArgumentParser, at_least
from sparrow.kernels import (
    BACKENDS,
    PageSummary,
    paged_decode,
    resolve_backend,
    select_pages,
    sparse_decode,
    update_page_summaries,
)

PEAK_TBPS = {"H200": 4.8, "H100": 3.35, "A100": 2.0}  # vendor HBM bandwidth by name substring


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(prog="sparrow-bench kernel", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="default: CUDA when present, else the CPU")
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument("--contexts", type=at_least(1), nargs="+", default=None, help="context tokens")
    p.add_argument("--budgets", type=at_least(1), nargs="+", default=None, help="budget tokens")
    p.add_argument("--batch", type=at_least(1), default=None, help="sequences decoded together")
    p.add_argument("--q-heads", type=at_least(1), default=None)
    p.add_argument("--kv-heads", type=at_least(1), default=None)
    p.add_argument("--head-dim", type=at_least(1), default=None)
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None)
    p.add_argument("--page-size", type=at_least(1), default=16)
    p.add_argument("--score", choices=["quest", "centroid"], default="quest")
    p.add_argument("--iters", type=at_least(1), default=None, help="timed calls per measurement")
    p.add_argument("--peak-tbps", type=float, default=None, help="HBM peak, TB/s (GPU only)")
    p.add_argument("--sweep", action="store_true", help="GPU: time Triton tile configs too")
    p.add_argument("--aot", action="store_true", help="compile every Triton variant for sm_90")
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = p.parse_args(argv)
    args.device = torch.device(args.device) if args.device else bench_device()
    gpu = args.device.type == "cuda"
    defaults = default_shape(gpu)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.q_heads % args.kv_heads:
        p.error(f"--q-heads {args.q_heads} must be a multiple of --kv-heads {args.kv_heads} (GQA)")
    return args


def detect_peak_tbps(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((tbps for key, tbps in PEAK_TBPS.items() if key in name), None)


def build_layer(args: argparse.Namespace, context: int, device: torch.device) -> dict:
    """A full-context batch with shuffled page tables and up-to-date page summaries, made on
    `device` (seeded there)."""
    with seeded(device, 0):
        return _random_layer(args, context, device)


def _random_layer(args: argparse.Namespace, context: int, device: torch.device) -> dict:
    pages_per_seq = -(-context // args.page_size)
    num_pages = args.batch * pages_per_seq
    dtype = DTYPES[args.dtype]
    shape = (num_pages, args.page_size, args.kv_heads, args.head_dim)
    k_cache = torch.randn(shape, device=device, dtype=dtype)
    v_cache = torch.randn(shape, device=device, dtype=dtype)
    # As the engine keeps them: the score mode's tables, in the cache dtype where Triton scores.
    triton_scores = resolve_backend(args.backend, k_cache) == "triton"
    summary = PageSummary.empty(
        num_pages, args.kv_heads, args.head_dim, device,
        score=args.score, dtype=dtype if triton_scores else torch.float32,
    )  # fmt: skip
    for start in range(0, num_pages, 8192):  # chunks bound the fp32 copy of the keys
        ids = torch.arange(start, min(start + 8192, num_pages), device=device)
        fill = torch.full_like(ids, args.page_size)
        update_page_summaries(k_cache, summary, ids, fill)
    order = torch.randperm(num_pages, device=device)
    return {
        "q": torch.randn(args.batch, args.q_heads, args.head_dim, device=device).to(dtype),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "page_table": order.view(args.batch, pages_per_seq).to(torch.int32),
        "seq_lens": torch.full((args.batch,), context, dtype=torch.int32, device=device),
        "summary": summary,
    }


def time_ms(fn, device: torch.device, iters: int) -> float:
    """Mean ms per call. GPU: back-to-back calls between two events (launch gaps included, as
    in a decode step); CPU: median of single calls."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / iters
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def bench_context(args, context: int, device: torch.device, peak_tbps: float | None) -> list[dict]:
    layer = build_layer(args, context, device)
    q, k_cache, v_cache = layer["q"], layer["k_cache"], layer["v_cache"]
    table, lens = layer["page_table"], layer["seq_lens"]
    elem = k_cache.element_size()
    kv_bytes_per_token = 2 * args.kv_heads * args.head_dim * elem  # K and V, all heads
    num_pages = table.shape[1]
    dense_bytes = args.batch * context * kv_bytes_per_token
    summary_tables = 2 if args.score == "quest" else 1
    summary_elem = layer["summary"].tables[0].element_size()
    select_bytes = args.batch * num_pages * args.kv_heads * args.head_dim * summary_elem
    select_bytes *= summary_tables
    resolved = resolve_backend(args.backend, q)
    backend = "torch" if resolved == "cpp" else resolved  # the separate ops' backend

    def dense():
        return paged_decode(q, k_cache, v_cache, table, lens, backend=backend, validate=False)

    dense_ms = time_ms(dense, device, args.iters)
    rows = []
    for budget_tokens in args.budgets:
        budget_pages = max(-(-budget_tokens // args.page_size), 3)
        budgets = torch.full((args.batch,), budget_pages, dtype=torch.int32, device=device)
        select_ms, sparse_decode_ms, sparse_ms = _time_sparse(
            args, layer, budgets, resolved, backend, device
        )
        sparse_bytes = (
            args.batch * min(budget_pages, num_pages) * args.page_size * kv_bytes_per_token
        )
        row = {
            "backend": resolved,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "dtype": args.dtype,
            "score": args.score,
            "batch": args.batch,
            "q_heads": args.q_heads,
            "kv_heads": args.kv_heads,
            "head_dim": args.head_dim,
            "context_tokens": context,
            "budget_tokens": budget_pages * args.page_size,
            "dense_ms": dense_ms,
            "select_ms": select_ms,
            "sparse_decode_ms": sparse_decode_ms,
            "sparse_ms": sparse_ms,
            "speedup": dense_ms / sparse_ms,
            "dense_bytes": dense_bytes,
            "sparse_bytes": sparse_bytes + select_bytes,
            "sparse_decode_bytes": sparse_bytes,
            # Issue 3's per-layer goal: sparse_ms <= 1.3 x (B/N + 1/16) x dense_ms.
            "goal_ratio": sparse_ms / ((budget_pages / num_pages + 1 / 16) * dense_ms),
        }
        if peak_tbps is not None:
            row.update(_bandwidth_fractions(row, peak_tbps))
        rows.append(row)
    return rows


def _time_sparse(
    args, layer: dict, budgets: torch.Tensor, resolved: str, backend: str, device: torch.device
) -> tuple[float | None, float | None, float]:
    """(select_ms, sparse_decode_ms, sparse_ms) at one budget. The cpp backend selects and
    attends in one fused call, so its two phases have no times of their own (None)."""
    q, k_cache, v_cache = layer["q"], layer["k_cache"], layer["v_cache"]
    table, lens, summary = layer["page_table"], layer["seq_lens"], layer["summary"]
    if resolved == "cpp":
        fused = functools.partial(
            sparse_decode, q, k_cache, v_cache, summary, table, lens, budgets,
            score=args.score, backend="cpp", validate=False,
        )  # fmt: skip
        return None, None, time_ms(fused, device, args.iters)
    sel_kw = dict(score=args.score, page_size=args.page_size, backend=backend)
    select = functools.partial(
        select_pages, q, summary, table, lens, budgets, **sel_kw, validate=False
    )
    decode = functools.partial(paged_decode, backend=backend, validate=False)
    selected = select()

    def sparse():
        return decode(q, k_cache, v_cache, table, lens, select())

    select_ms = time_ms(select, device, args.iters)
    sparse_decode_ms = time_ms(
        functools.partial(decode, q, k_cache, v_cache, table, lens, selected),
        device,
        args.iters,
    )
    return select_ms, sparse_decode_ms, time_ms(sparse, device, args.iters)


def _bandwidth_fractions(row: dict, peak_tbps: float) -> dict:
    """Achieved fractions of HBM peak from the row's bytes and times (GPU only; the cpp backend,
    with no separate decode time, never runs there)."""
    peak = peak_tbps * 1e12
    return {
        "peak_tbps": peak_tbps,
        "bandwidth_fraction": row["dense_bytes"] / (row["dense_ms"] * 1e-3) / peak,
        "sparse_decode_bandwidth_fraction": (
            row["sparse_decode_bytes"] / (row["sparse_decode_ms"] * 1e-3) / peak
        ),
        "sparse_bandwidth_fraction": row["sparse_bytes"] / (row["sparse_ms"] * 1e-3) / peak,
    }


def sweep_configs(args, device: torch.device, peak_tbps: float | None) -> list[dict]:
    """Time the Triton decode at the longest context under a few tile/warp/stage configs."""
    from sparrow.kernels.decode_triton import paged_decode_triton

    context = max(args.contexts)
    layer = build_layer(args, context, device)
    budget_pages = -(-min(args.budgets) // args.page_size)
    budgets = torch.full((args.batch,), budget_pages, dtype=torch.int32, device=device)
    selected = select_pages(
        layer["q"], layer["summary"], layer["page_table"], layer["seq_lens"], budgets,
        score=args.score, page_size=args.page_size,
    )  # fmt: skip
    q, k_cache, v_cache = layer["q"], layer["k_cache"], layer["v_cache"]
    token_bytes = 2 * args.kv_heads * args.head_dim * layer["k_cache"].element_size()
    rows = []
    for mode, sel, tokens in (("dense", None, context), ("sparse", selected, budget_pages * 16)):
        for ppi, warps, stages in SWEEP:
            run = functools.partial(
                paged_decode_triton, q, k_cache, v_cache, layer["page_table"], layer["seq_lens"],
                sel, args.head_dim**-0.5,
                pages_per_iter=ppi, num_warps=warps, num_stages=stages,
            )  # fmt: skip
            ms = time_ms(run, device, args.iters)
            row = {"mode": mode, "context_tokens": context, "pages_per_iter": ppi,
                   "num_warps": warps, "num_stages": stages, "ms": ms}  # fmt: skip
            if peak_tbps is not None:
                row["bandwidth_fraction"] = args.batch * tokens * token_bytes / (ms * 1e-3)
                row["bandwidth_fraction"] /= peak_tbps * 1e12
            rows.append(row)
            print(_format_row(row))
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args([] if argv is None else argv)
    if args.aot:
        return aot_table(args.json)
    device = args.device
    peak_tbps = args.peak_tbps if args.peak_tbps is not None else detect_peak_tbps(device)
    rows = []
    for context in args.contexts:
        for row in bench_context(args, context, device, peak_tbps):
            rows.append(row)
            print(_format_row(row), flush=True)
    if peak_tbps is not None:
        _print_goals(rows)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
        print(f"wrote {len(rows)} rows to {args.json}")
    if args.sweep and device.type == "cuda":
        sweep = sweep_configs(args, device, peak_tbps)
        if args.json is not None:
            path = args.json.with_suffix(".sweep.json")
            path.write_text(json.dumps(sweep, indent=1))
            print(f"wrote {len(sweep)} sweep rows to {path}")
    return 0


def aot_table(path: Path | None) -> int:
    """Compile every variant of kernel_aot.aot_variants() for Hopper; print and write the rows.
    Exit status 1 if any variant spills."""
    from sparrow.bench.kernel_aot import aot_variants, compile_all
    from sparrow.kernels.aot import backend_available

    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("sparrow-bench kernel --aot: unset TRITON_INTERPRET (it compiles, not interprets)")
        return 2
    if not backend_available():
        print("sparrow-bench kernel --aot: this Triton has no CUDA backend")
        return 2
    start = time.perf_counter()
    rows = compile_all(aot_variants())
    for row in rows:
        print(_format_row(row), flush=True)
    spilling = [r for r in rows if r["spills"]]
    print(f"{len(rows)} variants compiled for sm_90 in {time.perf_counter() - start:.0f} s; "
          f"{len(spilling)} spill")  # fmt: skip
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rows, indent=1))
        print(f"wrote {len(rows)} rows to {path}")
    return 1 if spilling else 0


def _format_row(row: dict) -> str:
    skip = {"device", "dtype", "score", "batch", "q_heads", "kv_heads", "head_dim", "peak_tbps"}
    parts = []
    for key, value in row.items():
        if key in skip:
            continue
        if key.endswith("_bytes"):
            parts.append(f"{key[:-6]}_MB={value / 1e6:.1f}")
        elif isinstance(value, float):
            parts.append(f"{key}={value:.3f}")
        else:
            parts.append(f"{key}={value}")
    return "  ".join(parts)


def _print_goals(rows: list[dict]) -> None:
    longest = max(r["context_tokens"] for r in rows)
    dense_bw = max(r["bandwidth_fraction"] for r in rows if r["context_tokens"] == longest)
    sparse_bw = min(
        r["sparse_decode_bandwidth_fraction"] for r in rows if r["context_tokens"] == longest
    )
    worst_ratio = max(r["goal_ratio"] for r in rows)
    print(f"goal dense HBM fraction >= 0.75 at {longest} tokens: {dense_bw:.3f}")
    print(
        f"goal sparse decode HBM fraction >= 0.65 (worst budget, {longest} tokens): {sparse_bw:.3f}"
    )
    print(f"goal sparse_ms / ((B/N + 1/16) dense_ms) <= 1.3 (worst row): {worst_ratio:.3f}")
