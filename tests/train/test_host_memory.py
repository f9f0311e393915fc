"""Host memory on the CPU: the memory plan bounds the trainer's peak, and the peak stays bounded.

The plan against the peak (`test_plan_bounds_the_measured_peak`): the README's two CPU commands,
`make train`'s (sparrow-train with no overrides) and `sparrow-train data=long_context`, each run
for 2 steps in a process that records the plan its memory fit made and, at exit, its own peak
resident size (ru_maxrss: start-up, evaluation, checkpoint and export included). On CPU the plan
counts the process itself (its RSS when the plan is made), so the two measure the same thing; the
W&B service is a process of its own. Two steps: AdamW's state is created at the end of the first
update, so the second's backward is the first that holds it. The long-context run keeps its
update although its rewards may carry no signal (rl.skip_no_signal=false: the same pass with zero
advantages) and skips the evaluation and the dense speedup rollout (engine phases, planned far
below the update). The plan must be at least the peak and at most 1.3x it (-s prints both).
tests/train/memory/test_measured_peaks.py pins the figures this measured on 2026-12-04.

    pytest tests/train/test_host_memory.py -m slow -s -k plan

No growth over a 200-step `sparrow-train preset=smoke` run (tiny model): samples the resident set
size of the training process and of its children (the W&B service) every 0.25 s, maps each sample
to the step in flight (rows of metrics.jsonl written so far), and asserts no growth trend once the
run is warm: the peak over steps 101-200 is within 5% (+32 MiB) of the peak over steps 21-100, and
the least-squares slope of the per-step peak over steps 21-200 is under 0.1 MiB per step (20 MiB
over the run). The per-step trace is written to $SPARROW_RSS_TRACE when set, and printed (run with
-s to see it).

    pytest tests/train/test_host_memory.py -m slow -s
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]
STEPS = 200
MIB = 1 << 20
GIB = 1 << 30

# The trainer's entry point, recording the plan of its memory fit and its own peak RSS.
_MEASURED_RUN = """
import json, resource, sys
import sparrow.train.memory.run_inputs as run_inputs
fits = []
fit_memory = run_inputs.fit_memory
def recorded(*args, **kwargs):
    fits.append(fit_memory(*args, **kwargs))
    return fits[-1]
run_inputs.fit_memory = recorded
from sparrow.cli.train import main
code = main(sys.argv[1:])
phase, plan = fits[0].plan.peak_phase()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
print("MEASURED " + json.dumps({"code": code, "plan": plan, "phase": phase, "peak": peak,
                                "line": fits[0].line()}))
sys.exit(code)
"""
README_COMMANDS = {
    "make-train": [],
    "long-context": [
        "data=long_context",
        "rl.skip_no_signal=false",
        "rl.eval.every=0",
        "monitor.speedup_every=0",
    ],
}
_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def _tree_rss(proc: psutil.Process) -> tuple[int, int]:
    """(RSS of the process, RSS of the process and all its descendants), bytes."""
    own = proc.memory_info().rss
    total = own
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return own, total


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


@pytest.mark.slow
def test_rss_has_no_growth_trend_over_200_steps(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}
    cmd = [sys.executable, "-m", "sparrow.cli.train", "preset=smoke", f"rl.steps={STEPS}"]
    with open(tmp_path / "train.err", "w") as err:
        popen = subprocess.Popen(
            [*cmd, f"run_dir={tmp_path / 'run'}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    proc = psutil.Process(popen.pid)
    metrics = tmp_path / "run" / "metrics.jsonl"
    peak_own: dict[int, int] = {}  # step in flight -> peak RSS of the trainer process
    peak_tree: dict[int, int] = {}  # step in flight -> peak RSS with its children
    start = time.monotonic()
    while popen.poll() is None and time.monotonic() - start < HANG_GUARD_S:
        try:
            own, tree = _tree_rss(proc)
        except psutil.NoSuchProcess:
            break
        # Rows logged = steps done (plus the step-0 evaluation row); the next one is in flight.
        rows = metrics.read_text().count("\n") if metrics.exists() else 0
        step = max(rows, 1)
        peak_own[step] = max(peak_own.get(step, 0), own)
        peak_tree[step] = max(peak_tree.get(step, 0), tree)
        time.sleep(0.25)
    assert popen.wait(timeout=HANG_GUARD_S) == 0, (tmp_path / "train.err").read_text()[-3000:]

    trace = {
        "steps": sorted(peak_own),
        "own_mib": [peak_own[s] / MIB for s in sorted(peak_own)],
        "tree_mib": [peak_tree[s] / MIB for s in sorted(peak_tree)],
        "wall_s": time.monotonic() - start,
    }
    if os.environ.get("SPARROW_RSS_TRACE"):
        Path(os.environ["SPARROW_RSS_TRACE"]).write_text(json.dumps(trace))
    for s in (1, 10, 20, 50, 100, 150, 200):
        if s in peak_own:
            print(
                f"step {s:3d}: trainer {peak_own[s] / MIB:7.1f} MiB, "
                f"with children {peak_tree[s] / MIB:7.1f} MiB"
            )

    for peaks in (peak_own, peak_tree):
        warm = [s for s in sorted(peaks) if 21 <= s <= 100]
        late = [s for s in sorted(peaks) if 101 <= s <= STEPS]
        assert len(warm) > 40 and len(late) > 50, "too few samples per step"
        early_peak = max(peaks[s] for s in warm)
        late_peak = max(peaks[s] for s in late)
        assert late_peak <= 1.05 * early_peak + 32 * MIB, (early_peak / MIB, late_peak / MIB)
        xs = warm + late
        slope = _slope(xs, [peaks[s] / MIB for s in xs])
        print(f"slope over steps 21-{STEPS}: {slope:+.4f} MiB/step")
        assert slope < 0.1, f"RSS grows by {slope:.3f} MiB per step"


# The long-context command's update was under-planned (step 1: 10.53 GiB measured, 10.14
# planned) until the checkpointed step counted the expanded cache's gradients; since then its
# step 1 is pinned in tests/train/memory/test_measured_peaks.py (plan 11.39 GiB, 1.08x), and this
# 2-step run, whose step-2 update holds AdamW's state too, has not yet run to its end.
@pytest.mark.slow
@pytest.mark.parametrize("command", list(README_COMMANDS))
def test_plan_bounds_the_measured_peak(command, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    env |= {"HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true"}
    args = [*README_COMMANDS[command], "rl.steps=2", f"run_dir={tmp_path / 'run'}"]
    # 4 h: a README command's long context trains for hours on a CPU (tests/hang_guard.py).
    out = subprocess.run(
        [sys.executable, "-c", _MEASURED_RUN, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=8 * HANG_GUARD_S,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    row = json.loads(out.stdout.split("MEASURED ", 1)[1].splitlines()[0])
    plan, peak = row["plan"], row["peak"]
    print(
        f"\n{command} ({' '.join(args[:-1])}): plan {plan / GIB:.2f} GiB ({row['phase']}), "
        f"measured peak {peak / GIB:.2f} GiB, ratio {plan / peak:.2f}\n  {row['line']}"
    )
    assert plan >= peak, f"the plan ({plan / GIB:.2f} GiB) is below the peak ({peak / GIB:.2f})"
    assert plan <= 1.3 * peak, f"the plan ({plan / GIB:.2f} GiB) is over 1.3x the peak"
