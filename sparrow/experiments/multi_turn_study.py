"""The multi-turn study (issue 62): SmolLM2-135M-Instruct on the shipped tool task (`env=python`: a
Python tool in the sandbox, the GSM8K-shaped sample examples/gsm8k_mini.jsonl), sparse rollouts
under the online controller at tau 0.86 against dense ones, seeds 0, 1, 2. Per step it reads the
tool calls and turns per episode, the reward and the held-out accuracy; per run the KV-read ratio
of each assistant turn (kv_read_ratio/turn<k>).

Sized to finish all six runs in about 50 minutes on a 2-core CPU (SIZE below; one step of 4 x 4
episodes of 64 tokens a turn took 275 s on the loaded VM, docs/multi_turn/README.md): 2 steps of
4 prompts x 4 samples, at most 3 assistant turns of 64 tokens, greedy held-out accuracy on the
file's held-out quarter before training and after every step.

Every run is its own `sparrow-train` process in ROOT/<arm>_s<seed> with `resume=auto`, seed-major
(a stopped study has whole seeds): invoking the command again continues an interrupted run and
skips finished ones. `--report` (also run at the end) copies each run's metrics.jsonl into
docs/multi_turn/runs/<run>/ and writes the tables into docs/multi_turn/README.md from those
copies alone (a run not logged is a row marked missing).

    python -m sparrow.experiments.multi_turn_study --background   # start or continue, detached
    python -m sparrow.experiments.multi_turn_study --status       # one line per run
    python -m sparrow.experiments.multi_turn_study --report       # the tables from the copies
    python -m sparrow.experiments.multi_turn_study --long         # 128-token turns, 4 steps
    python -m sparrow.experiments.multi_turn_study --seeds 0 -- preset=tiny rl.steps=2

Arguments after `--` are Hydra overrides handed to every run.
"""

import sys

from sparrow.experiments.multi_turn_table import write_multi_turn_report
from sparrow.experiments.study import Arm, Size, Study, study_main

SIZE = (
    "rl.steps=2",
    "rl.prompts_per_step=4",
    "rl.group_size=4",
    "rollout.max_new_tokens=64",
    "env.max_turns=3",
    "data.heldout_fraction=0.25",
    "rl.eval.every=1",
    "rl.eval.max_new_tokens=64",
    "rl.save_every=1",
)
ARMS = (
    Arm("sparse", ("controller.tau=0.86",), "sparse: online controller, tau 0.86 (the default)"),
    Arm("dense", ("schedule.mode=dense",), "dense rollouts"),
)
# --long: turns long enough to end (at 64 tokens three in four episodes hit the cap before their
# end token or a tool call), twice the samples per prompt and twice the steps.
LONG = Size(
    "long",
    ("rl.steps=4", "rl.group_size=8", "rollout.max_new_tokens=128", "rl.eval.max_new_tokens=128"),
    "4 steps of 4 x 8 episodes, turns of 128 tokens",
)
STUDY = Study(
    name="multi_turn",
    doc=__doc__,
    arms=ARMS,
    report=lambda inv, steps: write_multi_turn_report(inv.root, inv.runs, steps, inv.docs),
    shared=("logger=disabled", "rollout.progress=false", "env=python", *SIZE),
    sizes=(LONG,),
)


def main(argv: list[str] | None = None) -> int:
    return study_main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
