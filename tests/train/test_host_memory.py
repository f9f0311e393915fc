"""Host memory stays bounded over a 200-step `sparrow-train preset=smoke` run (tiny model).

Samples the resident set size of the training process and of its children (the W&B service)
every 0.25 s, maps each sample to the step in flight (rows of metrics.jsonl written so far),
and asserts no growth trend once the run is warm: the peak over steps 101-200 is within 5% (+32
MiB) of the peak over steps 21-100, and the least-squares slope of the per-step peak over steps
21-200 is under 0.1 MiB per step (20 MiB over the run). The per-step trace is written to
$SPARROW_RSS_TRACE when set, and printed (run with -s to see it).

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

ROOT = Path(__file__).resolve().parents[2]
STEPS = 200
MIB = 1 << 20


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
    while popen.poll() is None and time.monotonic() - start < 1800:
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
    assert popen.wait(timeout=60) == 0, (tmp_path / "train.err").read_text()[-3000:]

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
