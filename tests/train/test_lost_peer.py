"""`lost_peer`: what gloo raises on the survivor of a collective whose peer died (a closed
connection) or stopped answering (the process group's timeout), told apart from other errors.
Two real ranks under torchrun, plain torch.distributed (no DeepSpeed, no trainer)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import CHILD_GUARD_S, HANG_GUARD_S

from sparrow.distributed import lost_peer

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE"}}
    env = {k: v for k, v in env.items() if not k.startswith(("MASTER_", "TORCHELASTIC_"))}
    return env | {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}


PEER = """
import os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
from sparrow.distributed import lost_peer

# Joining waits for the other rank's start-up (a hang guard); the collective under test runs in a
# group of its own whose 3 s timeout is what "hangs" must meet. The group is made under the hang
# guard and only then given its 3 s: made with 3 s, its own creation timed out on rank 0 when the
# other rank came late (a clean-clone make test beside CPU hogs: rank 0 exit 1, nothing printed).
guard = timedelta(seconds=float(sys.argv[2]))
dist.init_process_group("gloo", timeout=guard)
group = dist.new_group(timeout=guard)
dist.distributed_c10d._set_pg_timeout(timedelta(seconds=3), group)
if dist.get_rank() == 1:
    if sys.argv[1] == "dies":
        os._exit(9)
    time.sleep(8)  # hangs past the 3 s timeout: rank 0 gives up first
    os._exit(0)
try:
    dist.all_reduce(torch.ones(1), group=group)
except RuntimeError as err:
    print("lost_peer", lost_peer(err), flush=True)
    os._exit(0)
except BaseException as err:  # anything else: said on stdout, where the test shows it
    print("unexpected", repr(err), flush=True)
    os._exit(1)
"""


@pytest.mark.parametrize("how", ["dies", "hangs"])
def test_a_collective_with_a_dead_or_silent_peer_is_a_lost_peer(tmp_path, how):
    """What gloo raises on the survivor, as lost_peer reads it (no DeepSpeed, no trainer)."""
    script = tmp_path / "peer.py"
    script.write_text(PEER)
    # torchrun kills the surviving rank once it sees a dead one; checking every 5 s (not 0.1 s)
    # leaves rank 0 the time to meet the loss in its collective (3 s timeout) under any load:
    # in one CI run the survivor was killed before it printed.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--monitor-interval", "5", "--master_port", str(_free_port()), str(script), how]
    cmd += [str(CHILD_GUARD_S)]
    done = subprocess.run(
        cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert "lost_peer True" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


def test_other_errors_are_not_a_lost_peer():
    try:
        raise RuntimeError("Connection closed by peer")  # the words, but not a collective
    except RuntimeError as err:
        assert not lost_peer(err)
    assert not lost_peer(RuntimeError("timed out"))  # never raised: no traceback
    assert not lost_peer(ValueError("timed out"))
