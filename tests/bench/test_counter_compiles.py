"""`sparrow-bench decode`'s launch counter leaves every Triton kernel object in its module, so a
kernel compiled while it counts (a new specialisation met by a counted step) still finds its
@triton.jit helpers: a fresh variant of the decode split kernel compiles for sm_90 ahead of time
(`triton.compile`, GPUTarget("cuda", 90, 32), no GPU) inside `count_triton_launches`.

The compile runs in a child process: this one imported the kernels under TRITON_INTERPRET=1,
and interpreted kernels do not compile. A fresh Triton cache makes it a real compile.
"""

import json
import os
import subprocess
import sys

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.kernels.aot import backend_available

pytestmark = pytest.mark.skipif(not backend_available(), reason="triton has no CUDA backend")

CHILD = """
import json, os
from sparrow.bench.dispatch_counter import DispatchCounter, count_triton_launches
from sparrow.kernels import decode_triton
from sparrow.kernels.aot import KernelVariant, compile_variant

# A variant no preset launches (group 3, head dim 32, page 8, fp16): not in any cache.
constexprs = decode_triton.decode_constexprs(
    3, 32, 8, __import__("torch").float16, decode_triton.DEFAULT_TILES, dense=False,
    split_out=True,
)
variant = KernelVariant("decode_split", "fp16", tuple(sorted(constexprs.items())), 4, 2)
counter = DispatchCounter()
with count_triton_launches([decode_triton], counter):
    kinds = {n: type(getattr(decode_triton, n)).__name__
             for n in ("_decode_split_kernel", "_page_ids", "_load_tile")}
    row = compile_variant(variant, arch=90)
print(json.dumps({"kinds": kinds, "row": row}))
"""


def test_a_kernel_compiles_for_sm90_while_its_launches_are_counted(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"TRITON_CACHE_DIR": str(tmp_path / "cache"), "TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(out["kinds"].values()) == {"JITFunction"}, out["kinds"]  # no stand-ins
    assert out["row"]["regs"] > 0 and out["row"]["GROUP"] == 3
    assert any(p.is_file() for p in (tmp_path / "cache").rglob("*.cubin"))  # it compiled
