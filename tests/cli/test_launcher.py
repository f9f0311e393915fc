"""A failed multi-rank run ends with sparrow's own line and its exit code, not torchrun's.

torchrun ended a run whose rank was lost with its agent's traceback and failure table (exit 1),
the survivor's line some 30 lines above. scripts/launch_multinode.sh now runs torchrun's agent
in sparrow/cli/launcher.py: the run ends with a line naming each failed rank's exit, then the
line the explaining rank stopped with (written to torchrun's error file by `stop_line`), and
exits with that rank's code. Cheap here: fake workers that import no torch (the real trainer
losing a rank is tests/train/test_lost_rank.py, slow).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from sparrow.cli.errors import stop_line
from sparrow.cli.launcher import failure_lines

ROOT = Path(__file__).resolve().parents[2]
LOST = (
    "sparrow-train: rank 0 of 2 stops: another rank was lost (a collective failed: Connection "
    "closed by peer); run the same command again on every rank: resume=auto continues from the "
    "newest complete checkpoint in runs/x/checkpoints"
)

# Rank 1 dies (SIGKILL) or crashes (a traceback, exit 1); rank 0 then stops as sparrow-train
# does after a lost rank: it ignores torchrun's SIGTERM and exits 4 with its one line.
WORKER = f"""
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # before anything: torchrun's SIGTERM may be quick
from pathlib import Path
from sparrow.cli.errors import stop_line

died = Path(sys.argv[1])
ready = died.with_name("rank0_ignores_sigterm")
if os.environ["RANK"] == "1":
    while not ready.exists():  # under load rank 0's interpreter may start well after this one
        time.sleep(0.05)
    died.touch()
    if sys.argv[2] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("a bug in rank 1")
ready.touch()
while not died.exists():
    time.sleep(0.05)
sys.exit(stop_line({LOST!r}, 4))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "how, rank1", [("killed", "was killed by SIGKILL"), ("crashed", "exited with 1")]
)
def test_launcher_ends_a_lost_rank_run_with_sparrows_line(tmp_path, how, rank1):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE"}}
    env = {k: v for k, v in env.items() if not k.startswith(("MASTER_", "TORCHELASTIC_"))}
    env |= {
        "PYTHON": sys.executable,
        "NPROC_PER_NODE": "2",
        "MASTER_PORT": str(_free_port()),
        "RDZV_ID": f"launcher-{os.getpid()}-{how}",
        "SPARROW_ENTRY": str(worker),
        "OMP_NUM_THREADS": "1",
    }
    cmd = ["bash", str(ROOT / "scripts" / "launch_multinode.sh"), str(tmp_path / "died"), how]
    done = subprocess.run(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=HANG_GUARD_S,
    )  # fmt: skip
    lines = done.stdout.rstrip().splitlines()
    assert done.returncode == 4, done.stdout[-3000:]  # the survivor's code: a rank was lost
    assert lines[-2:] == [
        f"launch_multinode.sh: rank 0 exited with 4, rank 1 {rank1}; rank 0 said:",
        LOST,
    ], done.stdout[-3000:]
    assert "ChildFailedError" not in done.stdout  # torchrun's own ending is gone
    if how == "crashed":  # the crash's own traceback stays, above
        assert "RuntimeError: a bug in rank 1" in done.stdout


def _failure(tmp_path, rank: int, exitcode: int, line: str | None = None, record=None):
    """torchrun's ProcessFailure of a worker that wrote `line` with stop_line (or `record`,
    what torch's @record writes, or nothing)."""
    error_file = tmp_path / f"error_{rank}.json"
    if line is not None:
        os.environ["TORCHELASTIC_ERROR_FILE"] = str(error_file)
        try:
            assert stop_line(line, exitcode) == exitcode
        finally:
            del os.environ["TORCHELASTIC_ERROR_FILE"]
    elif record is not None:
        error_file.write_text(json.dumps(record))
    return ProcessFailure(rank, 1000 + rank, exitcode, str(error_file))


def test_failure_lines_end_with_the_lowest_explaining_ranks_line(tmp_path):
    failures = {
        2: _failure(tmp_path, 2, 4, LOST.replace("rank 0 of 2", "rank 2 of 4")),
        1: _failure(tmp_path, 1, -9),
        3: _failure(tmp_path, 3, 143, "sparrow-train: stopped by SIGTERM ..."),
    }
    lines, code = failure_lines(failures)
    assert lines == [
        "launch_multinode.sh: rank 1 was killed by SIGKILL, rank 2 exited with 4, rank 3 "
        "exited with 143; rank 2 said:",
        LOST.replace("rank 0 of 2", "rank 2 of 4"),
    ]
    assert code == 4


def test_failure_no_rank_explained_exits_1(tmp_path):
    traceback = {"message": {"message": "RuntimeError: boom", "extraInfo": {"timestamp": "0"}}}
    failures = {0: _failure(tmp_path, 0, 1, record=traceback), 1: _failure(tmp_path, 1, -9)}
    lines, code = failure_lines(failures)
    assert lines == [
        "launch_multinode.sh: rank 0 exited with 1, rank 1 was killed by SIGKILL; no rank said "
        "why (see the output above)"
    ]
    assert code == 1
