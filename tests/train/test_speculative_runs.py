"""`sparrow-train preset=tiny rollout.speculative.enabled=true rl.steps=2` for real (the CLI, the
DeepSpeed actor), alone and with rl.async.staleness=1, with cluster.rollout_ranks=1 (a 2-rank
launch: the rollout rank drafts and verifies) and with DistillSparse (distill=default, gate
true: its adapter drafts, the dense policy verifies). The runs draft at a 3-page budget of
4-token pages, so drafts are really rejected; the synchronous runs' rollout correction reads
ratio 1 to the engine's tolerance (correction/weight_min/max and mismatch/ratio_min/max within
1e-4 of 1), where the approximate sparse run of the same command is off by more than 1e-2.
A combination the engine cannot verify is refused in one line, exit 2, before the model loads.
Slow: five runs of ~1-2 min each on a loaded 2-core CPU (tests/README.md has the figures).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

ROOT = Path(__file__).resolve().parents[2]
SPARSE = [
    "preset=tiny",
    "rl.steps=2",
    "rl.eval.every=0",
    "rollout.engine.page_size=4",  # the ~60-token rows span ~15 pages
    "schedule.mode=fixed",
    "schedule.budgets_pages=[3]",
]
SPECULATIVE = ["rollout.speculative.enabled=true", "rollout.speculative.draft_tokens=3"]
TOLERANCE = 1e-4  # the engine's log-prob agreement with a dense forward (fp32), as a ratio


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE"}}
    env = {k: v for k, v in env.items() if not k.startswith(("MASTER_", "TORCHELASTIC_"))}
    return env | {"HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def train(run_dir: Path, *overrides: str, ranks: int = 1) -> subprocess.CompletedProcess:
    """One run (ranks == 2: scripts/launch_multinode.sh, the last rank rolling out)."""
    env = _env()
    args = [*overrides, f"run_dir={run_dir}"]
    if ranks == 1:
        cmd = [sys.executable, "-m", "sparrow.cli.train", *args]
    else:
        env |= {"PYTHON": sys.executable, "NPROC_PER_NODE": str(ranks)}
        env |= {"MASTER_PORT": str(_free_port()), "RDZV_ID": f"spec-{os.getpid()}"}
        cmd = ["bash", str(ROOT / "scripts" / "launch_multinode.sh"), *args]
    return subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def worst_ratio(row: dict) -> float:
    """The farthest from 1 of a step's rollout-correction weights and mismatch ratios."""
    keys = ("correction/weight_min", "correction/weight_max")
    keys += ("mismatch/ratio_min", "mismatch/ratio_max")
    return max(abs(row[k] - 1.0) for k in keys)


def _ran(done: subprocess.CompletedProcess, run_dir: Path, steps: int = 2) -> list[dict]:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    logged = rows(run_dir)
    assert [r["step"] for r in logged] == list(range(1, steps + 1))
    return logged


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [(), ("distill=default", "distill.gate=true")],
    ids=["plain", "distill"],
)
def test_a_speculative_run_reads_ratio_one_where_the_sparse_one_does_not(tmp_path, extra):
    spec = _ran(train(tmp_path / "spec", *SPARSE, *SPECULATIVE, *extra), tmp_path / "spec")
    for row in spec:
        assert worst_ratio(row) < TOLERANCE, (row["step"], worst_ratio(row))
        assert row["correction/truncated_frac"] == 0.0 and row["correction/masked_frac"] == 0.0
    sparse = _ran(train(tmp_path / "sparse", *SPARSE, *extra), tmp_path / "sparse")
    assert max(worst_ratio(row) for row in sparse) > 1e-2  # the same budget, not lossless


@pytest.mark.slow
def test_a_speculative_run_one_step_ahead(tmp_path):
    """rl.async.staleness=1: step 1's rows are the initial weights' (ratio 1); step 2's are one
    version behind the update they feed, which the ratio then measures (not the drafts)."""
    run_dir = tmp_path / "async"
    logged = _ran(train(run_dir, *SPARSE, *SPECULATIVE, "rl.async.staleness=1"), run_dir)
    assert [r["async/staleness"] for r in logged] == [0.0, 1.0]
    assert worst_ratio(logged[0]) < TOLERANCE, worst_ratio(logged[0])


@pytest.mark.slow
def test_a_speculative_run_on_a_rollout_rank(tmp_path):
    """A 1 + 1 launch: the rollout rank's engine drafts and verifies; its step 1 rows (the
    initial weights, as the training rank's) read ratio 1."""
    run_dir = tmp_path / "ranks"
    extra = ("rl.async.staleness=1", "cluster.rollout_ranks=1")
    done = train(run_dir, *SPARSE, *SPECULATIVE, *extra, ranks=2)
    logged = _ran(done, run_dir)
    assert "rollout ranks: 1 of 2 (the last), draws one step ahead" in done.stdout + done.stderr
    assert worst_ratio(logged[0]) < TOLERANCE, worst_ratio(logged[0])


def test_a_merged_adapter_is_refused_before_the_model_loads(tmp_path):
    """distill.gate=false would merge phi into the engine's weights, and the verify pass must be
    the dense policy's: one line, exit 2, and the model (a path that does not exist) never
    loads."""
    cmd = [sys.executable, "-m", "sparrow.cli.train", "preset=tiny", *SPECULATIVE]
    cmd += ["distill=default", "distill.gate=false", f"model.name={tmp_path / 'no_model'}"]
    done = subprocess.run(
        [*cmd, f"run_dir={tmp_path / 'run'}"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "distill.gate=true" in lines[0], done.stderr
    assert not (tmp_path / "run").exists()
