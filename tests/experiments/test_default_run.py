"""The default run in the docs is what the code gives: docs/default_run/README.md's tables and the
README's results row are generated from the committed runs' metrics.jsonl (default suite), and
`make train`'s command, rerun, gives them again (slow).

How the slow test knows which claim holds: a seeded run repeats to the byte only on the host
that ran it (sparrow/train/run/host.py), so it compares this host's fingerprint (`python -m
sparrow.train.run.host`, in the run's environment) with docs/default_run/host.json. Equal: the
first 3 steps must equal the committed metrics.jsonl in every non-timing value. Different, or
no host.json (the committed run predates it, so every host is "another host" until it is
regenerated): the whole run must learn within the stated spread (default_run_spread.py's
`claim_failures`).
"""

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.cli.config_loader import load_config
from sparrow.experiments import default_run_report as report
from sparrow.experiments import default_run_spread as spread_runs
from sparrow.train.logs.metrics_logger import read_metrics
from sparrow.train.run.host import run_host
from sparrow.train.run.stored_config import FILE_NAME as RUN_CONFIG
from sparrow.train.run.stored_config import flatten

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "default_run"
_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
# Wall-clock figures differ run to run; every other value of a seeded run is reproducible.
_TIMINGS = re.compile(r"^time/|_s$|tok_s|^speedup/measured$|^memory/")
STEPS = 3
# Keys a run of make train's config may set: where it writes and what it prints, and the seed.
_FREE_KEYS = re.compile(r"^(run_dir|seed|logger\.|rollout\.progress)")


def _rows(path: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["step"]: {k: v for k, v in r.items() if not _TIMINGS.search(k)} for r in rows}


def test_the_readme_row_and_the_study_tables_are_generated_from_the_committed_runs():
    assert report.main(["--check"]) == 0, "run: python -m sparrow.experiments.default_run_report"


def _copy_run(src: Path, dst: Path, accuracy: float | None = None) -> None:
    dst.mkdir(parents=True)
    for name in ("metrics.jsonl", "console.log", "README.md", "host.json"):
        if (src / name).exists():
            (dst / name).write_text((src / name).read_text())
    if accuracy is not None:
        rows = [json.loads(line) for line in (src / "metrics.jsonl").read_text().splitlines()]
        last_eval = max(i for i, r in enumerate(rows) if "eval/accuracy" in r)
        rows[last_eval]["eval/accuracy"] = accuracy
        (dst / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_generated_row_follows_the_metrics(tmp_path):
    """A changed value in a committed run's metrics.jsonl changes the README row and the spread:
    neither is a copy."""
    runs = [replace(spread_runs.SPREAD[0], path="default_run")]
    _copy_run(DOCS, tmp_path / "default_run", accuracy=0.123)
    for i, run in enumerate(spread_runs.SPREAD[1:]):
        _copy_run(ROOT / run.path, tmp_path / f"run{i}", 0.987 if i == 0 else None)
        runs.append(replace(run, path=f"run{i}"))
    spread = spread_runs.read_spread(tuple(runs), tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text((ROOT / "README.md").read_text())
    texts = report.regenerate(tmp_path / "default_run", readme, spread)
    row = next(line for line in texts[readme].splitlines() if line.startswith(report.ROW_PREFIX))
    assert "-> 0.123 (paired" in row and " -> 0.123 to 0.987, paired gain" in row
    study = texts[tmp_path / "default_run" / "README.md"]
    assert "**0.123**" in study and "final accuracy 0.123 to 0.987" in study


def test_a_host_label_means_one_fingerprint(tmp_path):
    """Runs labelled one host whose host.json differ, or two labels with one fingerprint, are
    refused: the spread's host count is the fingerprints'."""
    b = next(r for r in spread_runs.SPREAD if run_host(ROOT / r.path) is not None)
    _copy_run(ROOT / b.path, tmp_path / "b1")
    _copy_run(ROOT / b.path, tmp_path / "b2")
    other = json.loads((tmp_path / "b2" / "host.json").read_text())
    other["launches"][0]["fingerprint"]["threads"] += 1
    (tmp_path / "b2" / "host.json").write_text(json.dumps(other))
    runs = (replace(b, path="b1"), replace(b, path="b2"))
    with pytest.raises(ValueError, match="carry different host.json"):
        spread_runs.read_spread(runs, tmp_path)
    assert (
        len(spread_runs.read_spread(runs[:1] + (replace(b, path="b2", host="C"),), tmp_path).hosts)
        == 2
    )
    with pytest.raises(ValueError, match="two host labels carry one fingerprint"):
        spread_runs.read_spread((runs[0], replace(b, path="b1", host="C")), tmp_path)


def test_the_spread_holds_only_runs_of_make_trains_config():
    """docs/pipeline's sync_s0 repeats the committed run value for value (its sync arm is make
    train's config); a spread run that stored its config differs from make train's only in
    where it writes, what it prints, and its seed."""
    assert _rows(ROOT / "docs/pipeline/runs/sync_s0/metrics.jsonl") == _rows(DOCS / "metrics.jsonl")
    default = flatten(asdict(load_config([])))
    stored = [ROOT / r.path / RUN_CONFIG for r in spread_runs.SPREAD]
    assert any(path.exists() for path in stored)
    for run, path in zip(spread_runs.SPREAD, stored, strict=True):
        if path.exists():
            config = flatten(json.loads(path.read_text()))
            # A key newer than the run is at its default there; one it stored must match.
            changed = {k for k, v in config.items() if k not in default or default[k] != v}
            assert all(_FREE_KEYS.match(k) for k in changed), sorted(changed)
            assert config["seed"] == run.seed


def test_the_spread_names_the_committed_run_as_its_console_log_does():
    head = (DOCS / "console.log").read_text().splitlines()[0]
    committed = spread_runs.SPREAD[0]
    assert committed.path == "docs/default_run" and committed.seed == 0
    assert f"commit {committed.commit}," in head and f"date {committed.date}," in head


def test_the_claim_refuses_a_run_that_does_not_learn_or_lands_outside_the_spread():
    spread = spread_runs.read_spread()
    assert len(spread.outcomes) >= 4 and len(spread.hosts) >= 2
    for committed in spread.outcomes:  # each committed run makes the claim it states
        assert spread_runs.claim_failures(committed, spread) == []
    run = spread.outcomes[0]
    flat = replace(run, after=0.335, after_lo=0.273, after_hi=0.403, gain=0.005, gain_lo=-0.05)
    failures = spread_runs.claim_failures(flat, spread)
    assert len(failures) == 2 and "does not lie above 0" in failures[0]
    assert "misses the stated spread" in failures[1]
    lo, _ = spread.after
    # Learning, but short of every committed run by more than its own interval's width.
    weak = replace(run, after=lo - 0.1, after_lo=lo - 0.17, after_hi=lo - 0.03)
    failures = spread_runs.claim_failures(weak, spread)
    assert len(failures) == 1 and "misses the stated spread" in failures[0]
    # Short of the range by less than its interval's width: a run drawn from the same spread.
    near = replace(run, after=lo - 0.03, after_lo=lo - 0.1, after_hi=lo + 0.04)
    assert spread_runs.claim_failures(near, spread) == []


def test_a_step_whose_update_was_skipped_is_a_step():
    """A run that learned nothing (every update skipped: no loss logged) still ran its 13 steps:
    the claim, not the step count, is what refuses it."""
    b = spread_runs.SPREAD[-1]
    rows = read_metrics(ROOT / b.path)
    skipped = [{k: v for k, v in r.items() if not k.startswith("loss/")} for r in rows]
    assert spread_runs.outcome(b, skipped).steps == spread_runs.outcome(b, rows).steps == 13


def _run_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    return env | {"HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true"}


def _host_check() -> tuple[bool, str]:
    """(whether this host is the committed run's, why): its fingerprint, taken in the
    environment the run gets (the thread count is part of it), against docs/default_run's."""
    out = subprocess.run(
        [sys.executable, "-m", "sparrow.train.run.host"],
        cwd=ROOT,
        env=_run_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=True,
    )
    here, committed = json.loads(out.stdout), run_host(DOCS)
    if committed is None:
        return False, "docs/default_run has no host.json (it predates it): another host"
    differ = sorted(k for k in here.keys() | committed.keys() if here.get(k) != committed.get(k))
    if differ:
        return False, f"this host differs from docs/default_run's in {', '.join(differ)}"
    return True, "this host's fingerprint equals docs/default_run/host.json"


def _make_train(run_dir: Path, *overrides: str) -> Path:
    # `make train` runs `sparrow-train` with no overrides but these.
    cmd = [sys.executable, "-m", "sparrow.cli.train", *overrides, f"run_dir={run_dir}"]
    # 4 h: the whole default run (slow) on a CPU (tests/hang_guard.py).
    out = subprocess.run(
        cmd, cwd=ROOT, env=_run_env(), capture_output=True, text=True, timeout=8 * HANG_GUARD_S
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_on_the_committed_runs_host_make_train_repeats_its_first_steps(tmp_path):
    same, why = _host_check()
    if not same:
        pytest.skip(why)
    got = _rows(_make_train(tmp_path, f"rl.steps={STEPS}") / "metrics.jsonl")
    committed = _rows(DOCS / "metrics.jsonl")
    assert sorted(got) == list(range(STEPS + 1))
    for step in range(STEPS + 1):
        want = committed[step]
        assert {k: got[step].get(k) for k in want} == want, f"step {step}"
        extra = set(got[step]) - set(want)
        # The shortened run evaluates after its last step, where the full run goes on.
        assert all(k.startswith("eval/") for k in extra) and (not extra or step == STEPS), extra


@pytest.mark.slow
def test_on_another_host_make_train_learns_within_the_stated_spread(tmp_path):
    same, why = _host_check()
    if same:
        pytest.skip(f"{why}: the exact check holds this host to more")
    print(why)
    rows = read_metrics(_make_train(tmp_path))
    committed = spread_runs.SPREAD[0]
    run = spread_runs.outcome(committed, rows)
    assert run.steps == spread_runs.outcome(committed, read_metrics(DOCS)).steps
    spread = spread_runs.read_spread()
    gain = f"{run.gain:+.3f} ({run.gain_lo:+.3f} to {run.gain_hi:+.3f})"
    print(f"held-out {run.before:.3f} -> {run.after:.3f}, gain {gain}")
    assert spread_runs.claim_failures(run, spread) == []
