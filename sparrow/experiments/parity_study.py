"""The learning-parity study: does GRPO with sparse rollouts held at the tail rule (p5 >= tau)
learn like GRPO with dense rollouts, and what does a budget far below the rule do?

Three arms on the default run's setup (`conf/config.yaml`: SmolLM2-135M on the arithmetic task
behind its ~340-token system prompt), each with the same seeds and prompt order per seed:

- `online`: the default, online controller at tau 0.86;
- `dense`: `schedule.mode=dense`, the reference;
- `aggressive`: a fixed budget of the grid's smallest size, whose p5 sits far below tau.

Every run is its own `sparrow-train` process in ROOT/<arm>_s<seed> with `resume=auto`, one after
another (or `--jobs` at a time): invoking the command again continues an interrupted run and
skips finished ones. `--report` (also run at the end) writes the table into
docs/parity/README.md and overlay plots per seed under docs/parity/plots/.

    python -m sparrow.experiments.parity_study --background   # start or continue, detached
    python -m sparrow.experiments.parity_study --status       # one line per run
    python -m sparrow.experiments.parity_study --report       # table + plots from the logs
    python -m sparrow.experiments.parity_study --seeds 0,1 -- rl.steps=4

Arguments after `--` are Hydra overrides handed to every run.
"""

import argparse
import sys
from pathlib import Path

from sparrow.experiments.parity_table import write_parity_report
from sparrow.experiments.study_runs import REPO, StudyRun, drive_study

ARMS = {
    "online": ((), "online controller, tau 0.86 (the default)"),
    "dense": (("schedule.mode=dense",), "dense rollouts"),
    "aggressive": (
        ("schedule.mode=fixed", "schedule.budgets_pages=[3]"),
        "fixed 3 pages (48 tokens)",
    ),
}


def study_runs(arms: list[str], seeds: list[int]) -> list[StudyRun]:
    """One run per (seed, arm), seed-major: a stopped study has whole seeds to compare."""
    runs = []
    for seed in seeds:
        for arm in arms:
            overrides, setting = ARMS[arm]
            seeded = (*overrides, f"seed={seed}")  # sampling and prompt order, both from it
            runs.append(StudyRun(f"{arm}_s{seed}", seeded, f"{setting}, seed {seed}"))
    return runs


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = _parser().parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    arms = args.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        print(f"parity_study: unknown arms {unknown}; known: {sorted(ARMS)}", file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = study_runs(arms, seeds)
    overrides = ["logger=disabled", "rollout.progress=false", *extra]
    return drive_study(
        args,
        argv,
        args.root,
        runs,
        overrides,
        lambda steps: write_parity_report(args.root, runs, steps, args.docs),
        "sparrow.experiments.parity_study",
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="parity_study", description=__doc__.splitlines()[0], usage=__doc__
    )
    p.add_argument("--root", type=Path, default=REPO / "runs/parity", help="study root")
    p.add_argument("--docs", type=Path, default=REPO / "docs/parity", help="README + plots")
    p.add_argument("--arms", default="online,dense,aggressive", help="comma-separated arms")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time")
    p.add_argument("--report", action="store_true", help="only write the table and plots")
    p.add_argument("--status", action="store_true", help="print one line per run and exit")
    p.add_argument("--background", action="store_true", help="detach; log to ROOT/study.log")
    return p


if __name__ == "__main__":
    import signal

    from sparrow.experiments.study_runs import _terminate

    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())
