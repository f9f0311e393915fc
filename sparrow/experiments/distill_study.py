"""The DistillSparse study (issue 35): with many sparsely decoded tokens per step to learn from,
does the adapter let the online controller read fewer KV pages at the same tail?

Two arms on conf/preset/distill_study.yaml (SmolLM2-135M on the long-generation chain task, the
online controller at tau 0.86, theta frozen: `rl.update_policy=false`), each with seeds 0, 1, 2
(`seed=S`):

- `base`: `distill=disabled`: where the controller settles without an adapter;
- `adapter`: `distill=default` with the preset's pure distillation loss (top-K KL), the adapter
  trained on every step's rollouts and rolling out with them.

Every run is a `sparrow-train` process in ROOT/<arm>_s<seed> with `resume=auto`, one after another
(base before adapter within a seed): invoking the command again continues an interrupted run and
skips finished ones, also those whose files are complete in DOCS/runs/ (a fresh checkout has no
run dirs: a study spread over several sessions keeps its finished seeds). Then, per finished
adapter run, the offline tail (distill_tail) samples
held-out prompts at the budgets the base run of its seed settled at and scores the same tokens
with and without the adapter (skipped when its tail.json exists). Each run's metrics.jsonl,
run_config.json and tail.json go to DOCS/runs/<run>/ (a base run's settled budgets too, as
settled_budgets.json, for an adapter run finished later), and the table (distill_table, from those
files alone) into DOCS/README.md.

    python -m sparrow.experiments.distill_study --background   # start or continue, detached
    python -m sparrow.experiments.distill_study --status       # one line per run
    python -m sparrow.experiments.distill_study --report       # copies, missing tails, table
    python -m sparrow.experiments.distill_study --seeds 0 --preset tiny -- rl.steps=2

Arguments after `--` are Hydra overrides handed to every run.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

from sparrow.cli.config_loader import load_config
from sparrow.experiments.distill_table import write_distill_report
from sparrow.experiments.distill_tail import offline_tail, settled_budgets
from sparrow.experiments.stability_table import _rows_by_step
from sparrow.experiments.study_runs import REPO, StudyRun, drive_study, final_checkpoint

ARMS = {
    "base": (("distill=disabled",), "online tau 0.86, no adapter, theta frozen"),
    "adapter": (("distill=default",), "online tau 0.86, DistillSparse adapter, theta frozen"),
}
SHARED = ("rl.update_policy=false", "logger=disabled", "rollout.progress=false")
COPIED = ("metrics.jsonl", "run_config.json")
BUDGETS = "settled_budgets.json"  # a base run's final schedule, for its seed's adapter tail


def study_runs(arms: list[str], seeds: list[int]) -> list[StudyRun]:
    """One run per (seed, arm), seed-major, so that a stopped study has whole seeds."""
    runs = []
    for seed in seeds:
        for arm in arms:
            overrides, setting = ARMS[arm]
            runs.append(StudyRun(f"{arm}_s{seed}", (*overrides, f"seed={seed}"), setting))
    return runs


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = _parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    arms = args.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        print(f"distill_study: unknown arms {unknown}; known: {sorted(ARMS)}", file=sys.stderr)
        return 2
    runs = study_runs([a for a in ARMS if a in arms], [int(s) for s in args.seeds.split(",")])
    overrides = [f"preset={args.preset}", *SHARED, *extra]
    return drive_study(
        args,
        argv,
        args.root,
        runs,
        overrides,
        lambda steps: report(args, runs, overrides, steps),
        "sparrow.experiments.distill_study",
        lambda run, steps: archived(args, run, steps),
    )


def archived(args, run: StudyRun, steps: int) -> str | None:
    """DOCS/runs/<run> when it holds the run's every step (and an adapter run's tail), else None."""
    folder = args.docs / "runs" / run.name
    if len([s for s in _rows_by_step(folder) if s > 0]) < steps:
        return None
    tail_missing = args.tail_prompts and not (folder / "tail.json").is_file()
    return None if run.name.startswith("adapter_") and tail_missing else str(folder)


def report(args, runs: list[StudyRun], overrides: list[str], steps: dict[str, int]) -> None:
    """Copy the runs' files into DOCS/runs/, add the missing tails, write the table."""
    for run in runs:
        target = args.docs / "runs" / run.name
        for name in COPIED:
            if (args.root / run.name / name).is_file():
                target.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(args.root / run.name / name, target / name)
        if run.name.startswith("base_") and final_checkpoint(args.root / run.name, steps[run.name]):
            budgets = {"budgets_pages": settled_budgets(args.root / run.name)}
            (target / BUDGETS).write_text(json.dumps(budgets) + "\n")
    for run in runs:
        if args.tail_prompts and run.name.startswith("adapter_"):
            tail_of(args, run, overrides, steps)
    write_distill_report(args.docs, max(steps.values()))


def tail_of(args, run: StudyRun, overrides: list[str], steps: dict[str, int]) -> None:
    """The offline tail of a finished adapter run at its seed's base-run budgets, once."""
    out = args.docs / "runs" / run.name / "tail.json"
    base = "base_" + run.name.split("_", 1)[1]
    if out.is_file():
        return
    budgets = _base_budgets(args, base, steps.get(base, steps[run.name]))
    if final_checkpoint(args.root / run.name, steps[run.name]) is None or budgets is None:
        print(f"distill_study: no tail for {run.name} yet ({run.name} and {base} must finish)")
        return
    print(f"distill_study: offline tail of {run.name} at {base}'s budgets {budgets}", flush=True)
    cfg = load_config([*overrides, *run.overrides, f"run_dir={args.root / run.name}"])
    tail = offline_tail(cfg, args.root / run.name, budgets, args.tail_prompts, args.tail_samples)
    out.write_text(json.dumps({"budgets_from": base, **tail}, indent=1) + "\n")


def _base_budgets(args, base: str, steps: int) -> list[int] | None:
    """Where the finished base run's controller settled: from its final checkpoint, or archived
    beside its metrics when it finished in an earlier checkout; None while it has not finished."""
    if final_checkpoint(args.root / base, steps) is not None:
        return settled_budgets(args.root / base)
    archived_budgets = args.docs / "runs" / base / BUDGETS
    if archived_budgets.is_file():
        return json.loads(archived_budgets.read_text())["budgets_pages"]
    return None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="distill_study", description=__doc__.splitlines()[0], usage=__doc__
    )
    p.add_argument("--preset", default="distill_study", help="Hydra preset shared by all runs")
    p.add_argument("--root", type=Path, default=REPO / "runs/distill", help="study root")
    p.add_argument("--docs", type=Path, default=REPO / "docs/distill", help="README + runs/")
    p.add_argument("--arms", default="base,adapter", help="comma-separated arms")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    p.add_argument("--tail-prompts", type=int, default=16, help="held-out prompts; 0: no tail")
    p.add_argument("--tail-samples", type=int, default=2, help="samples per held-out prompt")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time")
    p.add_argument("--report", action="store_true", help="only copies, missing tails and table")
    p.add_argument("--status", action="store_true", help="print one line per run and exit")
    p.add_argument("--background", action="store_true", help="detach; log to ROOT/study.log")
    return p


if __name__ == "__main__":
    import signal

    from sparrow.experiments.study_runs import _terminate

    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())
