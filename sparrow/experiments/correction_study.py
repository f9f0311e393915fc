"""The rollout-correction study (issue 33): at the parity study's aggressive fixed budget (3 pages,
where the sparse policy rarely scores, most steps skip their update and held-out accuracy ends at
0.370 against dense's 0.598: docs/parity/README.md), does a masking correction or DAPO's dynamic
sampling recover the lost learning?

Five arms on the default run's setup (`conf/config.yaml`: SmolLM2-135M on the arithmetic task, 13
steps of 8 prompts x 6 samples, held-out accuracy on 200 prompts before and after), each with
seeds 0, 1, 2 (`seed=S`, the root of every random stream of a run):

- `tis`: today's default at 3 pages, token TIS (C = 2) and the no-signal skip;
- `token_mask`: IcePop, a token's loss dropped outside [0.5, 5] (OpenRLHF's default band);
- `seq_mask`: a sequence dropped when its geometric-mean ratio is outside SEQ_MASK_BAND;
- `tis_dynamic`: `tis` with dynamic sampling, up to DYNAMIC_MAX_ROUNDS rounds of 8 prompts;
- `dense`: `schedule.mode=dense`, the reference.

Every run is its own `sparrow-train` process in ROOT/<arm>_s<seed> with `resume=auto`, seed-major
(a stopped study has whole seeds): invoking the command again continues an interrupted run and
skips finished ones. `--report` (also run at the end) copies each run's metrics.jsonl into
docs/correction/runs/<run>/ and writes the table into docs/correction/README.md from those copies,
so it regenerates from the repository alone.

    python -m sparrow.experiments.correction_study --background   # start or continue, detached
    python -m sparrow.experiments.correction_study --status       # one line per run
    python -m sparrow.experiments.correction_study --report       # table + plot from the copies
    python -m sparrow.experiments.correction_study --seeds 0 -- preset=tiny rl.steps=2

Arguments after `--` are Hydra overrides handed to every run.
"""

import argparse
import sys
from pathlib import Path

from sparrow.cli.config_loader import compose_dict
from sparrow.experiments.correction_table import write_correction_report
from sparrow.experiments.stability_study import REPO, StudyRun, drive_study

AGGRESSIVE = ("schedule.mode=fixed", "schedule.budgets_pages=[3]")  # the parity study's arm
# OpenRLHF 0.11.2's default band for both its token (ICEPOP) and sequence masks.
TOKEN_MASK_BAND = (0.5, 5.0)
# OpenRLHF 0.11.2's band for its sequence mask too. At 3 pages the geometric-mean ratio of a
# sparse sequence is 0.43-1.0 (5th-95th percentile, one step): verl's (0.999, 1.001) and SkyRL's
# (0.99, 1.01) defaults drop every sparse sequence (87.5% of the step, all but the dense
# noise-floor prompt), OpenRLHF's (0.5, 5) drops 12.5% (docs/correction/README.md).
SEQ_MASK_BAND = (0.5, 5.0)
# ~3% of groups carry signal at 3 pages (9 of the parity study's 39 aggressive steps had any
# among their 8 groups: 1 - (1 - p)^8 = 9/39): 10 rounds keep ~2.6 groups per step, for an
# estimated ~2.6x the tis arm's wall time (docs/correction/README.md).
DYNAMIC_MAX_ROUNDS = 10

ARMS = {
    "tis": (AGGRESSIVE, "3 pages; token TIS, C = 2, no-signal skip (today's default)"),
    "token_mask": (
        (*AGGRESSIVE, "rl.correction.mode=token_mask")
        + (f"rl.correction.lo={TOKEN_MASK_BAND[0]}", f"rl.correction.hi={TOKEN_MASK_BAND[1]}"),
        f"3 pages; token mask (IcePop) [{TOKEN_MASK_BAND[0]}, {TOKEN_MASK_BAND[1]}]",
    ),
    "seq_mask": (
        (*AGGRESSIVE, "rl.correction.mode=seq_mask")
        + (f"rl.correction.lo={SEQ_MASK_BAND[0]}", f"rl.correction.hi={SEQ_MASK_BAND[1]}"),
        f"3 pages; geometric sequence mask [{SEQ_MASK_BAND[0]}, {SEQ_MASK_BAND[1]}]",
    ),
    "tis_dynamic": (
        (*AGGRESSIVE, "rl.dynamic_sampling.enabled=true")
        + (f"rl.dynamic_sampling.max_rounds={DYNAMIC_MAX_ROUNDS}",),
        f"3 pages; token TIS + dynamic sampling, <= {DYNAMIC_MAX_ROUNDS} rounds",
    ),
    "dense": (("schedule.mode=dense",), "dense rollouts (reference)"),
}


def study_runs(arms: list[str], seeds: list[int]) -> list[StudyRun]:
    """One run per (seed, arm), seed-major: a stopped study has whole seeds to compare."""
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
        print(f"correction_study: unknown arms {unknown}; known: {sorted(ARMS)}", file=sys.stderr)
        return 2
    runs = study_runs(arms, [int(s) for s in args.seeds.split(",")])
    overrides = ["logger=disabled", "rollout.progress=false", *extra]

    def report(steps: dict) -> Path:
        prompts = int(compose_dict(overrides).rl.prompts_per_step)
        return write_correction_report(args.root, runs, steps, prompts, args.docs)

    return drive_study(
        args, argv, args.root, runs, overrides, report, "sparrow.experiments.correction_study"
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="correction_study", description=__doc__.splitlines()[0], usage=__doc__
    )
    p.add_argument("--root", type=Path, default=REPO / "runs/correction", help="study root")
    p.add_argument(
        "--docs", type=Path, default=REPO / "docs/correction", help="README, runs/, plot"
    )
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time")
    p.add_argument("--report", action="store_true", help="only write the table and plot")
    p.add_argument("--status", action="store_true", help="print one line per run and exit")
    p.add_argument("--background", action="store_true", help="detach; log to ROOT/study.log")
    return p


if __name__ == "__main__":
    import signal

    from sparrow.experiments.stability_study import _terminate

    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())
