"""`sparrow-bench decode`: what one engine decode step launches, where it syncs, and what its
page-table update costs, for a random model with Qwen3-1.7B's attention shapes.

    sparrow-bench decode --json runs/bench_decode.json                 # torch + Triton (CPU)
    sparrow-bench decode --backends torch --dtypes bfloat16            # one configuration

The model has the 1.7B preset's 28 layers, 16 query / 8 KV heads and head dim 128 (layers 0 and
1 dense), with a small hidden size and vocabulary (`--hidden`, `--vocab`): the ops per layer do
not depend on them, and CPU time does. Counted with `DispatchCounter` (dispatch_counter.py) over
one steady-state decode step of the model runner (plan + forward + summary refresh): aten ops
that launch a kernel (views and metadata ops excluded) plus Triton kernel launches, grouped by
layer; host syncs (`.item()`/`.tolist()` and data-dependent shapes), inside the forward's layers
and for the whole step. On CPU the Triton kernels run in the interpreter (tiny shapes); the
Triton configurations launch what CUDA launches, the model's fused kernels included (they follow
the attention backend), so their counts are the GPU path's.

Page table: the per-step cost at `--pt-seqs` sequences x `--pt-pages` pages of the decode plan's
incremental update (decode_plan.py; every step one token more per sequence, a new page for one
sequence in 16) against rebuilding the padded table from Python lists as the runner did before,
timed in the same process. CPU wall time: the machine is shared, ratios are what to read.
"""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from sparrow.bench.device import bench_device, interpret_triton_without_cuda, synchronize

interpret_triton_without_cuda()  # before anything imports triton

from sparrow.bench.cuda_splits import (  # noqa: E402
    gpu_splits,
    merge_below_batch,
    num_sms,
    split_kernel_occupancy,
)
from sparrow.bench.dispatch_counter import DispatchCounter, count_triton_launches  # noqa: E402
from sparrow.bench.random_runner import advance, prefilled_runner, qwen3_1p7b_shaped  # noqa: E402
from sparrow.cli.errors import ArgumentParser, at_least  # noqa: E402
from sparrow.rollout.model_runner import ModelRunner  # noqa: E402
from sparrow.rollout.sequence import Sequence  # noqa: E402


class _LayerMarks(list):
    """The model's layer list, labelling the counter's group with the layer being run."""

    def __init__(self, layers, counter: DispatchCounter):
        super().__init__(layers)
        self.counter = counter

    def __iter__(self):
        for i, layer in enumerate(list.__iter__(self)):
            self.counter.group = f"layer{i}"
            yield layer
        self.counter.group = "head"


def count_step(runner: ModelRunner, seqs, budgets) -> dict:
    """Launches per layer (aten + Triton) and host syncs of one `runner.decode` call."""
    counter = DispatchCounter()
    layers = runner.model.layers
    runner.model.layers = _LayerMarks(layers, counter)
    try:
        counter.group = "plan"
        with count_triton_launches(_kernel_modules(), counter), counter:
            logits = runner.decode(seqs, budgets, update_summaries=True)
    finally:
        runner.model.layers = layers
    launches = counter.by_group
    num_layers = len(layers)
    dense = (
        set(runner.sparse_settings.dense_layers) if budgets is not None else set(range(num_layers))
    )
    per_layer = [launches[f"layer{i}"] for i in range(num_layers)]
    sparse_counts = [c for i, c in enumerate(per_layer) if i not in dense]
    dense_counts = [c for i, c in enumerate(per_layer) if i in dense]
    first_sparse = min(set(range(num_layers)) - dense, default=None)
    return {
        "logits": logits,
        "per_layer_sparse": sum(sparse_counts) / len(sparse_counts) if sparse_counts else None,
        "per_layer_dense": sum(dense_counts) / len(dense_counts) if dense_counts else None,
        "launches_total": sum(launches.values()),
        "launches_outside_layers": launches["plan"] + launches["head"],
        "syncs_in_layers": sum(n for g, n in counter.syncs_by_group.items() if g != "plan"),
        "syncs_total": counter.num_syncs,
        "sync_ops": dict(counter.syncs),
        "triton_launches": sum(counter.triton_launches.values()),
        # the last sparse layer: the first one also builds per-step state in older code
        "ops_of_a_sparse_layer": dict(counter.ops_by_group.get(f"layer{num_layers - 1}", {}))
        if first_sparse is not None
        else {},
    }


def _kernel_modules() -> list:
    """The loaded sparrow.kernels modules: their Triton kernels are counted."""
    return [m for n, m in list(sys.modules.items()) if n.startswith("sparrow.kernels.") and m]


def page_table_costs(
    num_seqs: int,
    num_pages: int,
    steps: int = 32,
    page_size: int = 16,
    device: torch.device | str = "cpu",
) -> dict:
    """ms per step: the plan's incremental update vs the old rebuild from lists (with its copy to
    `device`), same process; on CUDA each timing waits for the copies it queued."""
    from sparrow.rollout.decode_plan import DecodePlan

    device = torch.device(device)
    pool = num_seqs * (num_pages + steps)
    gen = torch.Generator().manual_seed(0)  # host page ids
    order = torch.randperm(pool, generator=gen).tolist()
    seqs = []
    for i in range(num_seqs):
        pages = order[i * num_pages : (i + 1) * num_pages]
        # Staggered lengths: each step one sequence in 16 starts a new page.
        tokens = (num_pages - 1) * page_size + 1 + (i % page_size)
        seq = Sequence(i, i, [5] * tokens, steps + 1)
        seq.page_table = list(pages)
        seqs.append(seq)
    spare = iter(order[num_seqs * num_pages :])
    plan = DecodePlan(
        page_size=page_size, num_sink=1, num_recent=2, scratch_page=pool,
        device=device, slots=num_seqs,
    )  # fmt: skip
    plan.update(seqs, None)  # the first step writes every row once
    update_s = rebuild_s = 0.0
    entries = 0
    for _ in range(steps):
        for seq in seqs:
            seq.completion_ids.append(7)
            if len(seq.page_table) < -(-seq.num_tokens // page_size):
                seq.page_table.append(next(spare))
        synchronize(device)
        start = time.perf_counter()
        step = plan.update(seqs, None)
        synchronize(device)
        update_s += time.perf_counter() - start
        entries += plan.last_update_entries
        start = time.perf_counter()
        old = _rebuild_page_table(seqs, page_size).to(device)
        synchronize(device)
        rebuild_s += time.perf_counter() - start
        lens = torch.tensor([len(s.page_table) for s in seqs], device=device)
        used = torch.arange(old.shape[1], device=device) < lens[:, None]
        got = step.page_table[:, : old.shape[1]]
        assert torch.equal(got[used], old[used]), "the plan's page table differs from the rebuild"
    return {
        "page_table_update_ms": 1e3 * update_s / steps,
        "page_table_rebuild_ms": 1e3 * rebuild_s / steps,
        "page_table_entries_written_per_step": entries / steps,
    }


def _rebuild_page_table(seqs: list[Sequence], page_size: int) -> torch.Tensor:
    """The runner's per-step metadata before the plan (commit 743a922), for comparison: built
    on the host (the caller copies it to the device, as that runner did)."""
    max_pages = max(len(s.page_table) for s in seqs)
    table = [s.page_table + [0] * (max_pages - len(s.page_table)) for s in seqs]
    page_table = torch.tensor(table, dtype=torch.int32, device="cpu")  # (B, max_pages)
    seq_lens = torch.tensor([s.num_tokens for s in seqs], dtype=torch.int64, device="cpu")  # (B,)
    positions = seq_lens - 1
    page_table.gather(1, (positions // page_size)[:, None])
    return page_table


def run_config(args, dtype_name: str, backend: str) -> dict:
    dtype = getattr(torch, dtype_name)
    interpreted = backend == "triton" and args.device.type != "cuda"
    # The Triton interpreter takes ~2 s per layer and step at these head shapes: fewer layers.
    layers = args.triton_layers if interpreted else 28
    config = qwen3_1p7b_shaped(args.hidden, args.vocab, layers)
    lens = args.triton_lens if interpreted else args.lens
    runner, seqs, bm = prefilled_runner(config, dtype, backend, lens, device=args.device)
    budgets = [args.budget] * len(seqs)
    # A warm step (the dense layers' copies), then one counted step each.
    advance(seqs, bm, runner.decode(seqs, budgets, update_summaries=True))
    sparse = count_step(runner, seqs, budgets)
    advance(seqs, bm, sparse.pop("logits"))
    advance(seqs, bm, runner.decode(seqs, None, update_summaries=True))  # warm the dense path
    dense = count_step(runner, seqs, None)
    dense.pop("logits")
    columns = max(len(s.page_table) for s in seqs)  # the counted dense step's page table width
    shape = {"batch": len(seqs), "layers": layers, "prompt_lens": lens, "page_columns": columns}
    return {"shape": shape, "sparse_step": sparse, "dense_step": dense}


# The headline shape of `sparrow-bench decode-step` (Qwen3-1.7B, 32K context, 2K-token budget).
HEADLINE: dict[str, Any] = {"context_pages": 32768 // 16, "budget_pages": 128, "batches": (16, 64)}


def cuda_launches(args, report: dict) -> dict:
    """Launches per layer a GPU makes for the bf16 Triton step counted here, and at the headline
    shape: the counted figures plus the merge launch of every attention call that splits
    (cuda_splits.py). Counted on CUDA, the merges are in the count already."""
    run = report["runs"].get("triton/bfloat16") or next(
        r for k, r in report["runs"].items() if k.startswith("triton/")
    )
    occupancy = split_kernel_occupancy(torch.bfloat16, group=2, head_dim=128, page_size=16)
    if occupancy is None:
        return {"error": "this Triton cannot compile the split kernel for sm_90"}
    sms = num_sms()
    counted_on_cuda = args.device.type == "cuda"
    shape = run["shape"]
    shapes = [("this bench's Triton step", shape["batch"], shape["page_columns"], args.budget)]
    shapes += [
        ("32K context, 2K-token budget", b, HEADLINE["context_pages"], HEADLINE["budget_pages"])
        for b in HEADLINE["batches"]
    ]
    rows = []
    for name, batch, pages, budget in shapes:
        dense = gpu_splits(batch, 8, pages, occupancy["dense"], sms)
        sparse = gpu_splits(batch, 8, min(budget, pages), occupancy["sparse"], sms)
        extra_sparse = 0 if counted_on_cuda else int(sparse > 1)
        extra_dense = 0 if counted_on_cuda else int(dense > 1)
        rows.append({
            "shape": name, "batch": batch, "pages": pages, "budget_pages": budget,
            "splits_dense": dense, "splits_sparse": sparse,
            "launches_per_layer_sparse": run["sparse_step"]["per_layer_sparse"] + extra_sparse,
            "launches_per_layer_dense": run["dense_step"]["per_layer_dense"] + extra_dense,
        })  # fmt: skip
    return {
        "num_sms": sms,
        "counted_on": "cuda" if counted_on_cuda else "interpreter (no splits)",
        "occupancy_sm90": occupancy,
        "merge_below_batch": merge_below_batch(8, occupancy["sparse"], sms),
        "shapes": rows,
    }


def print_cuda_launches(cuda: dict) -> None:
    if "error" in cuda:
        print(f"GPU split count: {cuda['error']}")
        return
    occ = cuda["occupancy_sm90"]["sparse"]
    print(
        f"on a GPU ({cuda['num_sms']} SMs, split kernel {occ['regs']} registers -> "
        f"{occ['ctas_per_sm']} CTAs/SM): rows split and a merge launches below batch "
        f"{cuda['merge_below_batch']} (8 KV heads)"
    )
    for r in cuda["shapes"]:
        print(
            f"  {r['shape']}, batch {r['batch']}: splits dense {r['splits_dense']} sparse "
            f"{r['splits_sparse']} -> launches/layer sparse {r['launches_per_layer_sparse']:.0f} "
            f"dense {r['launches_per_layer_dense']:.0f}"
        )


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report: dict[str, Any] = {
        "config": {k: str(v) if k == "device" else v for k, v in vars(args).items()}
    }
    report["device"] = _device_name(args.device)
    report["runs"] = {}
    for backend in args.backends:
        for dtype in args.dtypes:
            key = f"{backend}/{dtype}"
            report["runs"][key] = result = run_config(args, dtype, backend)
            s, d = result["sparse_step"], result["dense_step"]
            print(
                f"{key:>16}: launches/layer sparse {s['per_layer_sparse']:.1f} dense "
                f"{d['per_layer_dense']:.1f} | step launches {s['launches_total']} | syncs in "
                f"layers {s['syncs_in_layers']} (step {s['syncs_total']}: {s['sync_ops']})"
            )
    if args.pt_seqs > 0:
        report.update(page_table_costs(args.pt_seqs, args.pt_pages, device=args.device))
    main_run = report["runs"][f"{args.backends[-1]}/{args.dtypes[-1]}"]
    report["launches_per_layer_sparse"] = main_run["sparse_step"]["per_layer_sparse"]
    report["launches_per_layer_dense"] = main_run["dense_step"]["per_layer_dense"]
    report["host_syncs_per_step"] = max(
        r[k]["syncs_in_layers"]
        for r in report["runs"].values()
        for k in ("sparse_step", "dense_step")
    )
    report["host_syncs_per_step_whole_call"] = max(
        r[k]["syncs_total"] for r in report["runs"].values() for k in ("sparse_step", "dense_step")
    )
    if "triton" in args.backends:
        report["cuda"] = cuda_launches(args, report)
        print_cuda_launches(report["cuda"])
    if args.pt_seqs > 0:
        print(
            f"page table at {args.pt_seqs} x {args.pt_pages}: update "
            f"{report['page_table_update_ms']:.3f} ms/step vs rebuild "
            f"{report['page_table_rebuild_ms']:.3f} ms/step"
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(prog="sparrow-bench decode", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="default: CUDA when present, else the CPU")
    p.add_argument("--backends", nargs="+", default=["torch", "triton"])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument(
        "--hidden", type=at_least(1), default=64, help="hidden size (attention shapes fixed)"
    )
    p.add_argument("--vocab", type=at_least(1), default=256)
    p.add_argument("--lens", type=at_least(1), nargs="+", default=[150, 90, 40, 33])
    p.add_argument(
        "--triton-lens", type=at_least(1), nargs="+", default=[70], help="interpreter runs"
    )
    p.add_argument(
        "--triton-layers", type=at_least(1), default=3, help="layers of interpreter runs"
    )
    p.add_argument("--budget", type=at_least(1), default=4, help="pages per sparse layer")
    p.add_argument(
        "--pt-seqs", type=at_least(0), default=256, help="page-table timing: sequences, 0: skip"
    )
    p.add_argument(
        "--pt-pages", type=at_least(1), default=2048, help="page-table timing: pages each"
    )
    p.add_argument("--json", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    args.device = torch.device(args.device) if args.device else bench_device()
    return args
