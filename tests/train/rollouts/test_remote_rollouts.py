"""Rollout ranks serving the trainers (sparrow/train/rollouts/remote.py over sparrow/cluster.py):
the asynchronous loop's calls, answered across processes.

Each case runs tests/train/remote_worker.py under torchrun (gloo, CPU; ~40 s, mostly start-up):
half the world trains a stand-in loop whose update adds 1 to every weight and waits for the next
step's draw to start (so the overlap is proven by the run finishing, not by a clock); the other
half serves rollouts with a draw that reports the weights its engine holds.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sparrow.train.memory.plan import GiB

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1] / "rl"))
from hang_guard import HANG_GUARD_S  # noqa: E402
from test_distributed import clean_env, free_port  # noqa: E402

WORKER = HERE / "remote_worker.py"
STEPS = 4
MODEL_BYTES = 93_248 * 4  # the tiny tied llama's parameters, fp32, each once


def torchrun(out: Path, ranks: int, rollout: int, *args: str) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks)]
    cmd += ["--master_port", str(free_port()), str(WORKER), "--out", str(out)]
    cmd += ["--rollout-ranks", str(rollout), *args]
    proc = subprocess.run(
        cmd,
        env=clean_env(),
        cwd=HERE.parents[2],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return [torch.load(out / f"train{r}.pt", weights_only=False) for r in range(ranks - rollout)]


@pytest.mark.parametrize(
    ("ranks", "rollout"),
    [(2, 1), (3, 1), (4, 2)],
    ids=["1_trainer_1_rollout", "2_trainers_1_rollout", "2_trainers_2_rollout"],
)
def test_rows_are_one_version_behind_and_drawn_on_the_pushed_weights(tmp_path, ranks, rollout):
    for rank, record in enumerate(torchrun(tmp_path, ranks, rollout, "--steps", str(STEPS))):
        assert record["raised"] is None
        # The host's RAM is shared by its training ranks only: a rollout rank takes no share.
        assert record["ram_share"] == 12 * GiB // (ranks - rollout), record["ram_share"] / GiB
        assert [s[0] for s in record["steps"]] == list(range(STEPS))
        for step, version, seen in record["steps"]:
            # Staleness 1: step t's rows come from the weights after update t-1 (step 0 and 1:
            # the initial ones), drawn while the trainers ran update t-1.
            assert version == max(step - 1, 0)
            # The engine held exactly that version's weights (initial + version) for the draw.
            assert seen["embed"] == pytest.approx(record["initial"] + version, abs=1e-6)
            assert seen["payload"] == {"asked": step, "rank": rank}  # its trainer's, at submit
            assert seen["rank"] == rank % rollout  # rollout rank r serves trainers i % R == r
        pushed = [p["sync/push_bytes"] for p in record["push"]]
        assert pushed == [MODEL_BYTES if rank == 0 else 0.0] * STEPS  # training rank 0 sends
        assert all(p["sync/push_s"] >= 0 for p in record["push"])


def test_a_rollout_rank_lost_mid_draw_stops_the_trainer_as_a_lost_peer(tmp_path):
    (record,) = torchrun(tmp_path, 2, 1, "--steps", str(STEPS), "--die-in-draw", "2")
    assert len(record["steps"]) == 2  # steps 0 and 1 arrived; step 2's draw died
    text, lost = record["raised"]
    assert "PeerLost" in text and lost  # the CLI's one-line lost-rank stop, exit code 4
