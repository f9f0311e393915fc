"""A stale torch-extensions build lock holds up no start-up (issue 61 item 1).

DeepSpeed's CPU backend used to JIT-build its `deepspeed_shm_comm` op at every `init_distributed`,
under torch's lock file `$TORCH_EXTENSIONS_DIR/deepspeed_shm_comm/lock`. A start-up killed while
holding it (Ctrl-C, a preemption, torchrun ending a rank) left the file, and every later start-up
polled for it forever, printing nothing. sparrow.rl.actor now leaves the op unbuilt (only
DeepSpeed's inference all-reduce uses it). Planting the lock alone is enough to show the hang:
torch waits on the file before it looks at what is built, so no ~1 min compile is needed here.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]
# A parent test may have made this process a 1-rank group: the child starts its own.
_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def test_a_stale_build_lock_neither_hangs_sparrow_train_nor_is_anything_built(tmp_path):
    extensions = tmp_path / "torch_extensions"
    lock = extensions / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()  # what a killed builder leaves: no process holds it
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    env |= {"HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true", "TORCH_EXTENSIONS_DIR": str(extensions)}
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "sparrow.cli.train", "preset=tiny", f"run_dir={run_dir}"]
    # Before the fix this waited on the lock until the guard: TimeoutExpired, nothing printed.
    done = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").open()]
    assert steps[-1] == 2, steps  # preset=tiny's two steps, to the end
    assert (run_dir / "policy" / "model.safetensors").is_file()
    # Nothing was JIT-built at run time: the planted lock is all the directory holds.
    assert sorted(p.relative_to(extensions) for p in extensions.rglob("*")) == [
        lock.parent.relative_to(extensions),
        lock.relative_to(extensions),
    ]
