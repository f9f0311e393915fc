"""`sparrow-bench pipeline --layouts`: two ranks colocated (each trains and rolls out its half of
the step, synchronously) against one rollout rank and one training rank (`cluster.rollout_ranks=1`,
the draw one step ahead), in one bench run, from the same overrides and seed.

Each arm is a real 2-rank launch of sparrow-train under torchrun's agent (sparrow/cli/launcher.py,
the launcher scripts/launch_multinode.sh runs), evaluation and checkpoints between steps off; its
steps come from the run's metrics.jsonl (training rank 0's): `time/step_s` and every phase, the
rollout rank's own `async/<phase>_s` and the push's `sync/push_s` and `sync/push_bytes`. The first
`warmup` steps are dropped, and the ratio is over the measured steps after the first of both arms:
layout_speedup = colocated step seconds / rollout-rank step seconds (means). On one CPU host both
arms share the same cores, so the ratio there shows what the split costs or saves in structure
(one engine drawing all prompts while the trainer updates, against two engines on half each), not
what it would on GPUs (docs/pipeline/ simulates that).
"""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ARMS = {
    "colocated2": ["cluster.rollout_ranks=0", "rl.async.staleness=0"],
    "rollout1_train1": ["cluster.rollout_ranks=1", "rl.async.staleness=1"],
}
STEP_KEYS = ("time/", "async/", "sync/push_")


def run_layouts(overrides: list[str], steps: int, warmup: int, tmp: Path) -> dict:
    """Both arms' measured steps and their ratio; an arm whose launch failed holds its `error`
    (the launch's last lines) instead, and the ratio is then None."""
    report: dict = {}
    for label, arm in ARMS.items():
        run_dir = tmp / label
        forced = [
            *arm,
            f"run_dir={run_dir}",
            "rl.eval.every=0",
            "rl.save_every=0",
            "logger.wandb.mode=disabled",
            f"rl.steps={warmup + steps}",
        ]
        print(f"\n== {label}: a 2-rank launch ({' '.join(arm)})", flush=True)
        try:
            report[label] = {"steps": launch(run_dir, [*overrides, *forced])[warmup:]}
        except RuntimeError as err:
            print(err, flush=True)
            report[label] = {"error": str(err)}
    if any("error" in report[label] for label in ARMS):
        report["layout_speedup"] = None
        return report
    colocated, split = (mean_step_s(report[label]) for label in ARMS)
    report["layout_speedup"] = colocated / split
    return report


def launch(run_dir: Path, overrides: list[str]) -> list[dict]:
    """One 2-rank sparrow-train run; its steps' timings (RuntimeError when it failed)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE"}}
    env = {k: v for k, v in env.items() if not k.startswith(("MASTER_", "TORCHELASTIC_"))}
    cmd = [sys.executable, "-m", "sparrow.cli.launcher", "--standalone", "--nproc-per-node=2"]
    cmd += ["-m", "sparrow.cli.train", *overrides]
    log = run_dir.parent / f"{run_dir.name}.log"
    with open(log, "w") as out:
        code = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    if code:
        tail = "\n".join(log.read_text().splitlines()[-5:])
        raise RuntimeError(f"the 2-rank launch exited with {code}:\n{tail}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [step_row(row) for row in rows]


def step_row(row: dict) -> dict:
    """A step's seconds, its timed phases (the trainer's and the rollout rank's), the push."""
    timed = {k: v for k, v in row.items() if k.startswith(STEP_KEYS)}
    return {"step": row["step"], "step_s": row["time/step_s"], "phases": timed}


def mean_step_s(arm: dict) -> float:
    seconds = [s["step_s"] for s in arm["steps"]]
    return statistics.fmean(seconds[1:] or seconds)


def print_layouts(report: dict) -> None:
    labels = list(ARMS)
    if report["layout_speedup"] is None:
        return  # an arm failed: its error is printed and in the problems
    print(f"\n{'step':>6s}" + "".join(f"{label + ' s':>20s}" for label in labels))
    for i, rows in enumerate(zip(*(report[label]["steps"] for label in labels), strict=True)):
        print(f"{i + 1:6d}" + "".join(f"{r['step_s']:20.1f}" for r in rows))
    print(f"layout speedup (colocated / rollout rank apart): {report['layout_speedup']:.2f}x")
