"""The rollout-correction study (issue 33): at the parity study's aggressive fixed budget (3 pages,
where the sparse policy rarely scores, most steps skip their update and held-out accuracy ends at
0.370 against dense's 0.598: docs/parity/README.md), does a masking correction or DAPO's dynamic
sampling recover the lost learning?

Five arms on the default run's setup (`conf/config.yaml`: SmolLM2-135M on the arithmetic task, 13
steps of 8 prompts x 6 samples, held-out accuracy on 200 prompts before and after), each with
seeds 0, 1, 2 (`seed=S`, the root of every random stream of a run): `tis` (today's default at 3
pages: token TIS, C = 2, the no-signal skip), `token_mask` (IcePop), `seq_mask` (geometric
sequence mask), `tis_dynamic` (`tis` with dynamic sampling) and `dense` (the reference).

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

import sys

from sparrow.cli.config_loader import compose_dict
from sparrow.experiments.correction_table import write_correction_report
from sparrow.experiments.study import Arm, Study, study_main

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


def _masked(mode: str, what: str, band: tuple[float, float]) -> Arm:
    """`tis` with the correction `mode` (rl.correction) over the ratio band [lo, hi]."""
    lo, hi = band
    bounds = (f"rl.correction.lo={lo}", f"rl.correction.hi={hi}")
    overrides = (*AGGRESSIVE, f"rl.correction.mode={mode}", *bounds)
    return Arm(mode, overrides, f"3 pages; {what} [{lo}, {hi}]")


ARMS = (
    Arm("tis", AGGRESSIVE, "3 pages; token TIS, C = 2, no-signal skip (today's default)"),
    _masked("token_mask", "token mask (IcePop)", TOKEN_MASK_BAND),
    _masked("seq_mask", "geometric sequence mask", SEQ_MASK_BAND),
    Arm(
        "tis_dynamic",
        (*AGGRESSIVE, "rl.dynamic_sampling.enabled=true")
        + (f"rl.dynamic_sampling.max_rounds={DYNAMIC_MAX_ROUNDS}",),
        f"3 pages; token TIS + dynamic sampling, <= {DYNAMIC_MAX_ROUNDS} rounds",
    ),
    Arm("dense", ("schedule.mode=dense",), "dense rollouts (reference)"),
)


def report(inv, steps: dict[str, int]):
    prompts = int(compose_dict(inv.overrides).rl.prompts_per_step)
    return write_correction_report(inv.root, inv.runs, steps, prompts, inv.docs)


STUDY = Study(name="correction", doc=__doc__, arms=ARMS, report=report)


def main(argv: list[str] | None = None) -> int:
    return study_main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
