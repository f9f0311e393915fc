"""The speculative study (issue 59): `make train`'s task with speculative rollouts (sparse
drafts, dense verifies: `rollout.speculative.enabled=true`) against dense rollouts
(`schedule.mode=dense`). Every sample of the speculative arm is drawn from the dense policy, so the
same learning is expected; what differs is the rollout phase's time, compared per step.

Two arms on the default run's setup (`conf/config.yaml`: SmolLM2-135M on the arithmetic task, 13
steps of 8 prompts x 6 samples, held-out accuracy on 200 prompts before and after), each with
seeds 0, 1, 2 (`seed=S`): `dense` and `speculative` (the default online schedule's budgets draft,
k from `controller.objective=auto`, which is the throughput objective in this mode).

Every run is its own `sparrow-train` process in ROOT/<arm>_s<seed> with `resume=auto`, seed-major
(dense_s0, speculative_s0, dense_s1, ...: a stopped study holds whole pairs): invoking the
command again continues an interrupted run and skips finished ones. `--report` (also run at the
end) copies each run's metrics.jsonl into docs/speculative/runs/<run>/ and writes the tables into
docs/speculative/README.md from those copies, so they regenerate from the repository alone.

    python -m sparrow.experiments.speculative_study --background   # start or continue, detached
    python -m sparrow.experiments.speculative_study --status       # one line per run
    python -m sparrow.experiments.speculative_study --report       # the tables from the copies
    python -m sparrow.experiments.speculative_study --seeds 0 -- rl.steps=3

Arguments after `--` are Hydra overrides handed to every run (both arms alike).
"""

import sys

from sparrow.experiments.speculative_table import write_speculative_report
from sparrow.experiments.study import Arm, Study, study_main

ARMS = (
    Arm("dense", ("schedule.mode=dense",), "dense rollouts (the reference)"),
    Arm(
        "speculative",
        ("rollout.speculative.enabled=true",),
        "sparse drafts at the online schedule's budgets, dense verifies (lossless)",
    ),
)


def report(inv, steps: dict[str, int]):
    return write_speculative_report(inv.root, inv.runs, steps, inv.docs)


STUDY = Study(name="speculative", doc=__doc__, arms=ARMS, report=report)


def main(argv: list[str] | None = None) -> int:
    return study_main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
