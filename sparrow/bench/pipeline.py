"""`sparrow-bench pipeline`: the synchronous step against the one-step-off step on one process,
side by side: `rl.async.staleness=0` and `=1` from the same composed config and seed.

    sparrow-bench pipeline --json runs/bench_pipeline.json          # make train's config, 3 steps
    sparrow-bench pipeline --steps 2 preset=tiny                    # any Hydra overrides
    sparrow-bench pipeline --layouts                                # + 1+1 vs 2 colocated ranks

Each arm builds the trainer (as sparrow-train composes it, evaluation and the timed dense
re-rollout off), runs `--warmup` unmeasured steps and then `--steps` GRPO steps, timing each
`train_step()` on the wall clock together with the wait for the draw it left running (so that
nothing of one step runs during the next measurement, and an arm's steps add up to its time). The
JSON holds, per arm and step, the step's wall seconds and its phases (`time/<phase>_s`), and for
the asynchronous arm the producer's own phases (`async/<phase>_s`: its rollout, rewards and
same-weights replay, in its thread) and the overlap: the part of step t+1's draw that ran while
step t trained: the draw's seconds less what the trainer's thread blocked on it (`rollout_wait`
before the weight sync, the trailing wait, `rollout` at the next step's start). The first
measured step of the asynchronous arm takes a draw made during the warm-up; the ratios are over
the measured steps after the first of both arms: step_speedup = sync step seconds / async step
seconds (means). On a CPU both threads share the cores, so the overlap there shows the
structure, not the GPU gain (docs/pipeline/ simulates that). Exits 1 when an arm skipped its
update or the asynchronous arm overlapped nothing. `--layouts` adds, in the same run, two 2-rank
launches: one rollout rank and one training rank against two colocated ranks (bench/layouts.py),
under `layouts` in the JSON with their ratio.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from sparrow.bench.layouts import print_layouts, run_layouts
from sparrow.bench.trainer_args import parse_with_overrides, trainer_parser, write_json
from sparrow.cli.errors import at_least

TIME_PREFIX, ASYNC_PREFIX, SUFFIX = "time/", "async/", "_s"
MEASURE_DEFAULTS = {"monitor.speedup_every": "0", "rl.skip_no_signal": "false"}


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    from sparrow.cli.config_loader import ConfigError, load_config

    for key, value in MEASURE_DEFAULTS.items():
        if not any(o.split("=", 1)[0].lstrip("+~") == key for o in overrides):
            overrides = [*overrides, f"{key}={value}"]
    report: dict = {"config": {"argv": list(argv or []), "overrides": overrides}}
    with tempfile.TemporaryDirectory(prefix="sparrow-bench-pipeline-") as tmp:
        if args.layouts:  # first: the launches plan for the host's RAM, which the arms below keep
            report["layouts"] = run_layouts(overrides, args.steps, args.warmup, Path(tmp))
        for label, staleness in (("sync", 0), ("async1", 1)):
            forced = [
                f"run_dir={tmp}/{label}",
                "rl.eval.every=0",
                "logger.wandb.mode=disabled",
                f"rl.async.staleness={staleness}",
                f"rl.steps={args.warmup + args.steps}",
            ]
            try:
                cfg = load_config([*overrides, *forced])
            except ConfigError as err:
                print(f"sparrow-bench pipeline: config error: {err}", flush=True)
                return 2
            report[label] = run_arm(cfg, args.steps, args.warmup, label)
            write_json(args.json, report)  # partial results survive a later timeout
        report |= ratios(report["sync"], report["async1"])
    report["problems"] = problems(report)
    print_table(report)
    if args.layouts:
        print_layouts(report["layouts"])
    write_json(args.json, report)
    for line in report["problems"]:
        print(f"sparrow-bench pipeline: {line}", flush=True)
    return 1 if report["problems"] else 0


def run_arm(cfg, steps: int, warmup: int, label: str) -> dict:
    """Build the trainer, run `warmup` unmeasured steps (first-call costs: the allocator, oneDNN's
    packing), then `steps` measured ones; per step its wall seconds and timed phases."""
    from sparrow.train.trainer import GRPOTrainer

    print(f"\n== {label}: building the trainer ({cfg.model.name})", flush=True)
    trainer = GRPOTrainer.from_config(cfg)
    rows = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        metrics = trainer.train_step()
        trainer.step += 1
        # The draw the step left running counts in this step's wall time (its share the step
        # did not overlap), so that nothing runs between two timed steps.
        trailing = trainer.source.pipeline.wait()
        wall = time.perf_counter() - start
        if i >= warmup:
            rows.append(step_row(metrics, wall, trailing))
        print(
            f"   step {trainer.step}{' (warm-up)' if i < warmup else ''}: {wall:.1f} s", flush=True
        )
    return {"steps": add_overlap(rows)}


def step_row(metrics: dict, wall_s: float, trailing_wait_s: float) -> dict:
    """The step's wall seconds, its phases and the producer's (with the wait for the draw it
    left running, `bench/trailing_wait`), and whether its update ran."""
    phases = {
        k.removesuffix(SUFFIX): v
        for k, v in metrics.items()
        if k.startswith((TIME_PREFIX, ASYNC_PREFIX)) and k.endswith(SUFFIX)
    }
    phases["bench/trailing_wait"] = trailing_wait_s
    skipped = bool(metrics.get("update/no_signal") or metrics.get("update/skipped"))
    return {"wall_s": wall_s, "phases": phases, "update_ran": not skipped}


def add_overlap(rows: list[dict]) -> list[dict]:
    """Each step's `overlap_s`: the seconds of the next step's draw that ran during this step,
    draw(t+1) less what the trainer's thread waited for it (before step t's weight sync, after
    step t, at step t+1's start); None on a synchronous arm and at the last step."""
    rows[-1]["overlap_s"] = None
    for now, nxt in zip(rows, rows[1:], strict=False):
        draw = nxt["phases"].get("async/draw")
        if draw is None:
            now["overlap_s"] = None
            continue
        phases = now["phases"]
        waited = phases.get("time/rollout_wait", 0.0) + phases["bench/trailing_wait"]
        waited += nxt["phases"]["time/rollout"]
        now["overlap_s"] = max(draw - waited, 0.0)
    return rows


def ratios(sync: dict, stale: dict) -> dict:
    """Mean step seconds over the measured steps after the first of each arm, and sync / async
    (the step speedup)."""

    def mean_after_first(arm: dict) -> float:
        walls = [s["wall_s"] for s in arm["steps"][1:]] or [arm["steps"][0]["wall_s"]]
        return statistics.fmean(walls)

    sync_s, async_s = mean_after_first(sync), mean_after_first(stale)
    overlaps = [s["overlap_s"] for s in stale["steps"] if s["overlap_s"] is not None]
    return {
        "sync_step_s": sync_s,
        "async_step_s": async_s,
        "step_speedup": sync_s / async_s,
        "overlap_s": statistics.fmean(overlaps) if overlaps else None,
    }


def problems(report: dict) -> list[str]:
    """Why the report does not compare whole steps (empty: it does)."""
    found = [
        f"the {label} run skipped its update at step {i + 1}"
        for label in ("sync", "async1")
        for i, s in enumerate(report[label]["steps"])
        if not s["update_ran"]
    ]
    layouts = report.get("layouts")
    if layouts is not None:
        found += [
            f"the {label} launch failed: {arm['error'].splitlines()[-1]}"
            for label, arm in layouts.items()
            if isinstance(arm, dict) and "error" in arm
        ]
        split = layouts["rollout1_train1"].get("steps", [])
        if not all(s["phases"].get("sync/push_bytes") for s in split):
            found.append("the rollout-rank arm pushed no weights at some step")
    if len(report["async1"]["steps"]) < 2:
        found.append("one step has nothing to overlap: run --steps 2 or more")
    elif not report["overlap_s"]:
        found.append("the asynchronous arm overlapped no rollout with an update")
    return found


def print_table(report: dict) -> None:
    print(f"\n{'step':>6s}{'sync s':>10s}{'async1 s':>10s}{'overlap s':>11s}")
    for i, (s, a) in enumerate(
        zip(report["sync"]["steps"], report["async1"]["steps"], strict=True)
    ):
        overlap = "-" if a["overlap_s"] is None else f"{a['overlap_s']:.1f}"
        print(f"{i + 1:6d}{s['wall_s']:10.1f}{a['wall_s']:10.1f}{overlap:>11s}")
    print(
        f"\nmeasured steps after the first: sync {report['sync_step_s']:.1f} s, async1 "
        f"{report['async_step_s']:.1f} s, step speedup {report['step_speedup']:.2f}x"
    )


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = trainer_parser("sparrow-bench pipeline", __doc__)
    p.add_argument("--steps", type=at_least(2), default=3, help="measured steps per arm (>= 2)")
    p.add_argument("--warmup", type=at_least(0), default=1, help="unmeasured steps before them")
    p.add_argument(
        "--layouts",
        action="store_true",
        help="also 1 rollout + 1 training rank vs 2 colocated ranks (two 2-rank launches)",
    )
    args, rest = parse_with_overrides(p, argv)
    return args, rest
