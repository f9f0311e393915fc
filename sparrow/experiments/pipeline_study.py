"""The staleness parity study (issue 51 item 5): does GRPO whose rollout of step t+1 runs while
step t updates (`rl.async.staleness=1`, weights one version old) learn like the synchronous loop?

Two arms on the default run's setup (`conf/config.yaml`: SmolLM2-135M on the arithmetic task, 13
steps of 8 prompts x 6 samples, sparse rollouts under the online controller, held-out accuracy
on 200 prompts before and after), each with seeds 0, 1, 2 (`seed=S` roots every random stream,
so both arms of a seed draw the same prompts in the same order and evaluate the same prompts):
`sync` (staleness 0, today's default) and `async1` (staleness 1). With `--rollout_ranks` (or
`--arms rollout1`) the extra arm `rollout1` runs staleness 1 as a 2-rank launch on this host, one
rank rolling out and one training (`cluster.rollout_ranks=1`); it draws what async1 draws, so a
seed of it should repeat async1's run.

Every run is its own `sparrow-train` process in ROOT/<arm>_s<seed> with `resume=auto`, seed-major:
invoking the command again continues an interrupted run and skips finished ones. `--report` (also
run at the end) copies each run's metrics.jsonl into docs/pipeline/runs/<run>/ and writes the
table and its sentence into docs/pipeline/README.md from those copies alone.

    python -m sparrow.experiments.pipeline_study --background   # start or continue, detached
    python -m sparrow.experiments.pipeline_study --status       # one line per run
    python -m sparrow.experiments.pipeline_study --report       # the table from the copies
    python -m sparrow.experiments.pipeline_study --seeds 0 -- preset=tiny rl.steps=2

Arguments after `--` are Hydra overrides handed to every run.
"""

import sys

from sparrow.experiments.pipeline_table import write_pipeline_report
from sparrow.experiments.study import Arm, Study, study_main

ARMS = (
    Arm("sync", ("rl.async.staleness=0",), "staleness 0: rollout, then update (the default)"),
    Arm("async1", ("rl.async.staleness=1",), "staleness 1: rollout t+1 during update t"),
    Arm(
        "rollout1",
        ("rl.async.staleness=1", "cluster.rollout_ranks=1"),
        "staleness 1, 1 rollout rank + 1 training rank (a 2-rank launch)",
        flag="rollout_ranks",
        ranks=2,
    ),
)
STUDY = Study(
    name="pipeline",
    doc=__doc__,
    arms=ARMS,
    report=lambda inv, steps: write_pipeline_report(inv.root, inv.runs, steps, inv.docs),
)


def main(argv: list[str] | None = None) -> int:
    return study_main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
