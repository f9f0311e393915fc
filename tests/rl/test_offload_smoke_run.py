"""ZeRO-Offload end to end (issue 60): the 2-step `preset=smoke` run with
`actor.offload_optimizer=cpu` equals the run without it, at ZeRO-2 (offload needs ZeRO >= 1), in
every non-timing metric and every exported weight.

Offload steps the AdamW moments with DeepSpeed's CPUAdam instead of torch's AdamW on the ZeRO
optimizer's fp32 partition: the same update, rounded differently. Measured on the 2-core AVX-512
Xeon VM (torch 2.13.0+cpu, DeepSpeed 0.19.8): weights max |diff| 1.19e-7, the 157 compared metric
values max |diff| 4.77e-7. TOLERANCE holds both; CPUAdam planted without bias correction moves
them by 7.1e-4 and 0.13. `accept/hist20` is left out: torch.histc drops an agreement computed as
1 + 1 ulp, so which tokens it counts in the top bin turns on the last bit (33 vs 38 here; the
default run loses 11 of 232 at step 1). Clamping fixes that but changes the committed runs'
histograms, which the slow default-run test compares byte for byte: a fix for the next rerun.
CPUAdam is a C++ op JIT-built on first use (minutes, once per $TORCH_EXTENSIONS_DIR); its build
takes ninja and the compiler from PATH, so the venv's bin goes first. Slow: each offload update
took minutes on the shared 2-core VM under load.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-6  # absolute, on metric values and weights (measured above: 4.8e-7, 1.19e-7)
_TIMINGS = re.compile(r"^time/|_s$|tok_s|/tokens_per_s|^speedup/measured$|^memory/")
_HISTOGRAM = "accept/hist20"  # see the docstring
_DIST = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def _run(run_dir: Path, *extra: str) -> tuple[dict[int, dict], dict]:
    env = {k: v for k, v in os.environ.items() if k not in _DIST} | {"HF_HUB_OFFLINE": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    cmd = [sys.executable, "-m", "sparrow.cli.train", "preset=smoke", "actor.zero_stage=2"]
    done = subprocess.run(
        [*cmd, *extra, f"run_dir={run_dir}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=2 * HANG_GUARD_S,  # two offload updates: minutes each on a loaded 2-core VM
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = {
        r["step"]: {k: v for k, v in r.items() if not _TIMINGS.search(k) and k != _HISTOGRAM}
        for r in rows
    }
    return steps, load_file(run_dir / "policy" / "model.safetensors")


@pytest.mark.slow
def test_offloaded_optimizer_run_equals_the_device_one(tmp_path):
    plain, plain_weights = _run(tmp_path / "plain")
    offload, offload_weights = _run(tmp_path / "offload", "actor.offload_optimizer=cpu")
    assert sorted(plain) == sorted(offload) and len([s for s in plain if s >= 1]) == 2
    metric_diff, compared = 0.0, 0
    for step, row in plain.items():
        assert sorted(row) == sorted(offload[step]), step
        for key, value in row.items():
            other = offload[step][key]
            if isinstance(value, float) and isinstance(other, float):
                if value != value and other != other:  # nan in both
                    continue
                metric_diff = max(metric_diff, abs(value - other))
                compared += 1
            else:
                assert value == other, (step, key)
    assert sorted(plain_weights) == sorted(offload_weights)
    weight_diff = max(
        float((plain_weights[k].float() - offload_weights[k].float()).abs().max())
        for k in plain_weights
    )
    print(f"\n{compared} metric values max |diff| {metric_diff:.3g}, weights {weight_diff:.3g}")
    assert metric_diff <= TOLERANCE and weight_diff <= TOLERANCE, (metric_diff, weight_diff)
