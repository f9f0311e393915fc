"""The stability study (issue 10): does training with sparse rollouts track dense training when the
tail acceptance p5 is held above tau, and does it degrade below?

The same setup (conf/preset/stability.yaml: SmolLM2 on the long-context task, one seed, one data
order) is trained once per schedule, each run a `sparrow-train` process in runs/stability/<name>,
one after another (a 2-core CPU fits one at a time). `resume=auto` is on, so invoking the command
again continues an interrupted run and skips a run whose final checkpoint exists. At the end (or
with --report) `sparrow-report` overlays the runs and a markdown table goes into
docs/stability/README.md (between its study-table markers).

    python -m sparrow.experiments.stability_study --background  # start or continue, detached
    python -m sparrow.experiments.stability_study --status      # one status line per run
    python -m sparrow.experiments.stability_study --report      # table and plots from the logs
    python -m sparrow.experiments.stability_study --distill     # also 0.80 + DistillSparse
    python -m sparrow.experiments.stability_study --short       # ~800-token prompts
    python -m sparrow.experiments.stability_study --quick --jobs 2  # ~450-token prompts, 2 at once
    python -m sparrow.experiments.stability_study --preset tiny --runs dense,tau086 -- rl.steps=2

Arguments after `--` are Hydra overrides handed to every run.
"""

import argparse
import signal
import sys
from pathlib import Path

from sparrow.experiments.stability_table import write_report
from sparrow.experiments.study_runs import REPO, StudyRun, _terminate, drive_study

RUNS = (
    StudyRun("dense", ("schedule.mode=dense",), "dense rollouts"),
    StudyRun("tau092", ("schedule.mode=online", "controller.tau=0.92"), "online, tau 0.92"),
    StudyRun("tau086", ("schedule.mode=online", "controller.tau=0.86"), "online, tau 0.86"),
    StudyRun("tau080", ("schedule.mode=online", "controller.tau=0.80"), "online, tau 0.80"),
    # 8 pages = 128 tokens: p5 ~0.59 on SmolLM2 at 2K context (docs/DESIGN.md §5), far below 0.75.
    StudyRun(
        "fixed_b8",
        ("schedule.mode=fixed", "schedule.budgets_pages=[8]"),
        "fixed 8 pages (128 tokens)",
    ),
)
DISTILL_RUN = StudyRun(
    "tau080_distill",
    ("schedule.mode=online", "controller.tau=0.80", "distill=default"),
    "online, tau 0.80 + DistillSparse",
)
# The alternative when the long documents cost too much for the CPU budget: ~600 words (~800
# tokens) per document, so every forward and backward pass is ~4x cheaper; all else the same.
SHORT_OVERRIDES = ("data.tasks.context_words=600",)
# Sized for one session on this 2-core CPU with two runs at a time (one core each; a step measured
# 107 s on one idle core; the five runs took 2 h 00 min on a loaded machine, docs/stability/quick):
# ~450-token prompts (all in position bin 0), 12 steps. The start
# budget of 16 pages (256 tokens, about half the context) lets the controller move either way, and
# patience 2 lets it move within 12 steps; lr 3e-5 so that 12 steps of 8 samples move the policy.
QUICK_OVERRIDES = (
    "data.tasks.context_words=300",
    "rl.steps=12",
    "rl.eval.every=6",
    "schedule.budgets_pages=[16]",
    "controller.patience=2",
    "actor.lr=3e-5",
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = _parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    size = "quick" if args.quick else "short" if args.short else None
    root = args.root or REPO / (f"runs/stability_{size}" if size else "runs/stability")
    runs = _select_runs(args)
    sized = {"quick": QUICK_OVERRIDES, "short": SHORT_OVERRIDES, None: ()}[size]
    overrides = [f"preset={args.preset}", *sized, *extra]
    docs = args.docs or REPO / (f"docs/stability/{size}" if size else "docs/stability")
    return drive_study(
        args, argv, root, runs, overrides, lambda steps: write_report(root, runs, steps, docs)
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stability_study", description=__doc__.splitlines()[0], usage=__doc__
    )
    p.add_argument("--preset", default="stability", help="Hydra preset shared by all runs")
    p.add_argument("--root", type=Path, default=None, help="study root (runs/stability)")
    p.add_argument("--docs", type=Path, default=None, help="README + plots (docs/stability)")
    p.add_argument("--runs", default=None, help="comma-separated run names (default: all)")
    p.add_argument("--distill", action="store_true", help="add tau 0.80 + DistillSparse")
    p.add_argument(
        "--short", action="store_true", help="~800-token documents (runs/stability_short)"
    )
    p.add_argument(
        "--quick", action="store_true", help="~450-token documents, 12 steps (runs/stability_quick)"
    )
    p.add_argument(
        "--jobs", type=int, default=1, help="runs at a time, each with cores / jobs threads"
    )
    p.add_argument("--report", action="store_true", help="only write the table and plots")
    p.add_argument("--status", action="store_true", help="print one line per run and exit")
    p.add_argument("--background", action="store_true", help="detach; log to ROOT/study.log")
    return p


def _select_runs(args) -> list[StudyRun]:
    known = [*RUNS, DISTILL_RUN]
    if args.runs is None:
        return [*RUNS, DISTILL_RUN] if args.distill else list(RUNS)
    names = args.runs.split(",")
    unknown = sorted(set(names) - {r.name for r in known})
    if unknown:
        raise SystemExit(
            f"stability_study: unknown runs {unknown}; known: {[r.name for r in known]}"
        )
    return [r for r in known if r.name in names]


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminate)  # `kill PID` stops the current run cleanly too
    sys.exit(main())
