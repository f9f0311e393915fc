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

import sys

from sparrow.experiments.parity_table import write_parity_report
from sparrow.experiments.study import Arm, Study, study_main

ARMS = (
    Arm("online", (), "online controller, tau 0.86 (the default)"),
    Arm("dense", ("schedule.mode=dense",), "dense rollouts"),
    Arm(
        "aggressive",
        ("schedule.mode=fixed", "schedule.budgets_pages=[3]"),
        "fixed 3 pages (48 tokens)",
    ),
)
STUDY = Study(
    name="parity",
    doc=__doc__,
    arms=ARMS,
    report=lambda inv, steps: write_parity_report(inv.root, inv.runs, steps, inv.docs),
)


def main(argv: list[str] | None = None) -> int:
    return study_main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
