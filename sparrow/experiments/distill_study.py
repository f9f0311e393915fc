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
skips finished ones, also those whose files are complete in DOCS/runs/ (distill_archive). Then,
per finished adapter run, the offline tail (distill_tail) samples held-out prompts at the budgets
the base run of its seed settled at and scores the same tokens with and without the adapter
(skipped when its tail.json exists). The runs' files go to DOCS/runs/<run>/, and the table
(distill_table, from those files alone) into DOCS/README.md.

    python -m sparrow.experiments.distill_study --background   # start or continue, detached
    python -m sparrow.experiments.distill_study --status       # one line per run
    python -m sparrow.experiments.distill_study --report       # copies, missing tails, table
    python -m sparrow.experiments.distill_study --seeds 0 --preset tiny -- rl.steps=2

Arguments after `--` are Hydra overrides handed to every run.
"""

import sys

from sparrow.experiments.distill_archive import archive_and_report, archived
from sparrow.experiments.study import Arm, Study, study_main

ARMS = (
    Arm("base", ("distill=disabled",), "online tau 0.86, no adapter, theta frozen"),
    Arm("adapter", ("distill=default",), "online tau 0.86, DistillSparse adapter, theta frozen"),
)


def _tail_options(p) -> None:
    p.add_argument("--tail-prompts", type=int, default=16, help="held-out prompts; 0: no tail")
    p.add_argument("--tail-samples", type=int, default=2, help="samples per held-out prompt")


STUDY = Study(
    name="distill",
    doc=__doc__,
    arms=ARMS,
    report=archive_and_report,
    shared=("rl.update_policy=false", "logger=disabled", "rollout.progress=false"),
    preset="distill_study",
    archived=archived,
    options=_tail_options,
)


def main(argv: list[str] | None = None) -> int:
    return study_main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
