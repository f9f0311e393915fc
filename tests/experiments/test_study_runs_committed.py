"""A study's report regenerates from the copies of its runs in docs/<study>/runs/, so those copies
must be committable although .gitignore ignores every other `runs/` folder. `--no-index`: the
patterns decide, not whether the file is already tracked (a tracked file is never reported)."""

import subprocess
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "path",
    ["docs/correction/runs/tis_s0/metrics.jsonl", "docs/distill/runs/adapter_s0/metrics.jsonl"],
)
def test_the_metrics_copies_are_not_git_ignored(path):
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "--no-index", path], cwd=REPO, timeout=HANG_GUARD_S
    )
    assert ignored.returncode == 1, f"{path} is git-ignored"
