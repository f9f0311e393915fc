"""Every Triton kernel variant that the engine (at the GPU presets' shapes) and the kernel sweep
can launch compiles for Hopper (sm_90) without a GPU, with no register spills.

The compiler runs in a child process (`sparrow-bench kernel --aot`): this pytest process has
TRITON_INTERPRET=1 set, and kernels decorated under it cannot be compiled. Triton caches each
compiled variant on disk, so only the first run pays for the compiles.
"""

import json
import os
import subprocess
import sys

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.bench.kernel_aot import aot_variants, preset_shapes
from sparrow.kernels.aot import backend_available

pytestmark = pytest.mark.skipif(not backend_available(), reason="triton has no CUDA backend")


def test_presets_give_the_engine_shapes():
    shapes = {(s.num_q_heads, s.num_kv_heads, s.head_dim, s.hidden_size) for s in preset_shapes()}
    # Qwen3 1.7B / 4B / 8B, and Qwen2.5-Math-1.5B and R1-Distill-Qwen-1.5B (one shape).
    expected = {(16, 8, 128, 2048), (32, 8, 128, 2560), (32, 8, 128, 4096), (12, 2, 128, 1536)}
    assert shapes == expected


def test_every_variant_compiles_for_hopper_without_spills(tmp_path):
    path = tmp_path / "aot.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    cmd = [sys.executable, "-m", "sparrow.bench.cli", "kernel", "--aot", "--json", str(path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert path.exists(), done.stdout + done.stderr
    rows = json.loads(path.read_text())
    keys = [{k: r[k] for k in v.row()} for r, v in zip(rows, aot_variants(), strict=True)]
    assert keys == [v.row() for v in aot_variants()]  # the very list the engine's launchers use
    kernels = {r["kernel"] for r in rows}
    assert kernels == {
        "decode_split", "merge_splits", "page_score", "add_rms_norm", "qk_norm_rope",
        "select_pages", "silu_mul", "write_kv",
    }  # fmt: skip
    assert any(r["kernel"] == "decode_split" and r["GROUP"] == 2 for r in rows)  # Qwen3-1.7B
    for row in rows:
        assert {"kernel", "dtype", "regs", "spills", "smem_bytes"} <= row.keys()
        assert 0 < row["regs"] <= 255 and row["smem_bytes"] <= 227 * 1024, row
        assert row["spills"] == 0, row
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
