"""No start-up waits forever behind a killed JIT build of DeepSpeed's CPUAdam (issue 61 item 1,
for ZeRO-Offload's op): torch's lock file left in the build directory is removed with a warning,
and a build that a live process holds is waited for, saying whom (sparrow/rl/op_build.py)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hang_guard import CHILD_GUARD_S, HANG_GUARD_S

from sparrow.rl.op_build import build_directory

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, extensions: Path) -> subprocess.Popen:
    env = os.environ | {"TORCH_EXTENSIONS_DIR": str(extensions), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


ADAM = """
    import logging, torch
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from sparrow.rl.actor import _adamw
    from sparrow.rl.actor_config import ActorConfig
    cfg = ActorConfig(offload_optimizer="cpu", zero_stage=2)
    opt = _adamw(torch.nn.Linear(4, 4), cfg)
    print("built", type(opt).__name__, flush=True)
"""


@pytest.mark.slow  # ninja re-checks (here: rebuilds) the op: minutes on the 2-core VM
def test_a_stale_cpu_adam_build_lock_is_removed_and_the_optimizer_built():
    # The op's own build directory: built there already (by test_actor_offload, or any offload
    # run), ninja only checks it (seconds); a copy elsewhere would be rebuilt (minutes).
    build = build_directory("cpu_adam")
    (build / "lock").touch()  # what a killed builder leaves: no process holds it
    child = _run(ADAM, build.parent)
    # Before the guard this polled the file until the hang guard: TimeoutExpired, nothing said.
    out, err = child.communicate(timeout=HANG_GUARD_S)
    assert child.returncode == 0, err[-3000:]
    assert "built DeepSpeedCPUAdam" in out
    assert f"removed {build / 'lock'}" in err, err[-2000:]
    assert not (build / "lock").exists()


HOLD = """
    import sys, time
    from sparrow.rl.op_build import op_build_guard
    with op_build_guard("toy_op"):
        print("holding", flush=True)
        sys.stdin.readline()  # until the test lets go
"""

WAIT = """
    import logging
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from sparrow.rl.op_build import op_build_guard
    with op_build_guard("toy_op"):
        print("got it", flush=True)
"""


def test_a_live_build_is_waited_for_and_named(tmp_path):
    extensions = tmp_path / "torch_extensions"
    holder = _run(HOLD, extensions)
    assert holder.stdout.readline().strip() == "holding"
    (build_dir := extensions / "toy_op").mkdir(parents=True, exist_ok=True)
    (build_dir / "lock").touch()  # the live holder's own lock file: not to be removed under it
    waiter = _run(WAIT, extensions)
    line = waiter.stderr.readline()  # said before it waits
    assert line.startswith(f"waiting for process {holder.pid}, which builds"), line
    assert (build_dir / "lock").exists()
    holder.kill()  # dies holding it: the kernel lets the waiter in, which clears the file
    out, err = waiter.communicate(timeout=CHILD_GUARD_S)
    assert out.strip() == "got it", err
    assert "removed" in err and not (build_dir / "lock").exists()
