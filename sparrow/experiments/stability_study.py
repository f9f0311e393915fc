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
    python -m sparrow.experiments.stability_study --preset tiny --arms dense,tau086 -- rl.steps=2

Arguments after `--` are Hydra overrides handed to every run.
"""

import sys

from sparrow.experiments.stability_table import write_report
from sparrow.experiments.study import Arm, Size, Study, study_main

ARMS = (
    Arm("dense", ("schedule.mode=dense",), "dense rollouts"),
    Arm("tau092", ("schedule.mode=online", "controller.tau=0.92"), "online, tau 0.92"),
    Arm("tau086", ("schedule.mode=online", "controller.tau=0.86"), "online, tau 0.86"),
    Arm("tau080", ("schedule.mode=online", "controller.tau=0.80"), "online, tau 0.80"),
    # 8 pages = 128 tokens: p5 ~0.59 on SmolLM2 at 2K context (docs/DESIGN.md §5), far below 0.75.
    Arm(
        "fixed_b8",
        ("schedule.mode=fixed", "schedule.budgets_pages=[8]"),
        "fixed 8 pages (128 tokens)",
    ),
    Arm(
        "tau080_distill",
        ("schedule.mode=online", "controller.tau=0.80", "distill=default"),
        "online, tau 0.80 + DistillSparse",
        flag="distill",
    ),
)
# The alternative when the long documents cost too much for the CPU budget: ~600 words (~800
# tokens) per document, so every forward and backward pass is ~4x cheaper; all else the same.
SHORT = Size("short", ("data.tasks.context_words=600",), "~800-token documents")
# Sized for one session on this 2-core CPU with two runs at a time (one core each; a step measured
# 107 s on one idle core; the five runs took 2 h 00 min on a loaded machine, docs/stability/quick):
# ~450-token prompts (all in position bin 0), 12 steps. The start
# budget of 16 pages (256 tokens, about half the context) lets the controller move either way, and
# patience 2 lets it move within 12 steps; lr 3e-5 so that 12 steps of 8 samples move the policy.
QUICK = Size(
    "quick",
    (
        "data.tasks.context_words=300",
        "rl.steps=12",
        "rl.eval.every=6",
        "schedule.budgets_pages=[16]",
        "controller.patience=2",
        "actor.lr=3e-5",
    ),
    "~450-token documents, 12 steps",
)
STUDY = Study(
    name="stability",
    doc=__doc__,
    arms=ARMS,
    report=lambda inv, steps: write_report(inv.root, inv.runs, steps, inv.docs),
    seeds=(),  # one seed, one data order: a run per arm
    shared=(),  # the runs log as the preset sets them up
    preset="stability",
    sizes=(SHORT, QUICK),
)


def main(argv: list[str] | None = None) -> int:
    return study_main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
