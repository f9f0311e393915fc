"""The default run in the docs is what the code gives: docs/default_run/README.md's table and the
README's results row are generated from docs/default_run/metrics.jsonl (default suite), and
`make train`'s command, rerun for its first steps, reproduces that file's values (slow)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sparrow.experiments import default_run_report as report

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "default_run"
_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
# Wall-clock figures differ run to run; every other value of a seeded run is reproducible.
_TIMINGS = re.compile(r"^time/|_s$|tok_s|^speedup/measured$")
STEPS = 3


def _rows(path: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["step"]: {k: v for k, v in r.items() if not _TIMINGS.search(k)} for r in rows}


def test_the_readme_row_and_the_study_table_are_generated_from_the_committed_run():
    assert report.main(["--check"]) == 0, "run: python -m sparrow.experiments.default_run_report"


def test_the_generated_row_follows_the_metrics(tmp_path):
    """A changed value in metrics.jsonl changes the README row: the row is not a copy."""
    docs = tmp_path / "default_run"
    docs.mkdir()
    for name in ("metrics.jsonl", "console.log", "README.md"):
        (docs / name).write_text((DOCS / name).read_text())
    rows = [json.loads(line) for line in (DOCS / "metrics.jsonl").read_text().splitlines()]
    last_eval = max(i for i, r in enumerate(rows) if "eval/accuracy" in r)
    rows[last_eval]["eval/accuracy"] = 0.123
    (docs / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    texts = report.regenerate(docs, readme)
    assert "-> 0.123 (paired" in texts[readme] and "**0.123**" in texts[docs / "README.md"]


@pytest.mark.slow
def test_make_train_reproduces_the_committed_run_for_its_first_steps(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    env |= {"HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true"}
    # `make train` runs `sparrow-train` with no overrides; the run stops after STEPS steps.
    cmd = [sys.executable, "-m", "sparrow.cli.train", f"rl.steps={STEPS}", f"run_dir={tmp_path}"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=7200)
    assert out.returncode == 0, out.stderr[-3000:]
    got, committed = _rows(tmp_path / "metrics.jsonl"), _rows(DOCS / "metrics.jsonl")
    assert sorted(got) == list(range(STEPS + 1))
    for step in range(STEPS + 1):
        want = committed[step]
        assert {k: got[step].get(k) for k in want} == want, f"step {step}"
        extra = set(got[step]) - set(want)
        # The shortened run evaluates after its last step, where the full run goes on.
        assert all(k.startswith("eval/") for k in extra) and (not extra or step == STEPS), extra
