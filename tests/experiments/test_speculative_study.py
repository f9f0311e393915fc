"""sparrow.experiments.speculative_study: its two arms x seeds (seed-major, so a stopped study
holds whole pairs), each arm's overrides what it says; the table builder's arithmetic on
hand-written metrics (per run, per arm, the rollout time ratio per step of each seed's pair);
and --report building the tables from the copies in DOCS/runs alone, no run dir present."""

import json
import shutil

import pytest

from sparrow.cli.config_loader import load_config
from sparrow.experiments import speculative_study as study
from sparrow.experiments import speculative_table as table
from sparrow.experiments.study_files import REPO, TABLE_BEGIN, TABLE_END

ARMS = {arm.name: arm for arm in study.ARMS}


def test_runs_alternate_the_arms_seed_by_seed():
    names = [r.name for r in study.STUDY.runs(list(ARMS), [0, 1, 2])]
    assert names == [f"{arm}_s{s}" for s in (0, 1, 2) for arm in ("dense", "speculative")]


def test_each_arm_configures_what_it_says():
    dense = load_config(list(ARMS["dense"].overrides))
    spec = load_config(list(ARMS["speculative"].overrides))
    assert dense.schedule.mode == "dense" and not dense.rollout.speculative.enabled
    assert spec.rollout.speculative.enabled and spec.schedule.mode != "dense"
    assert spec.rl == dense.rl  # the same task, steps and update: only the rollout differs


def _write(runs_dir, name, rollout_s, after=0.4, ratio=1.0):
    rows = [{"step": 0, "eval/accuracy": 0.3, "eval/accuracy_lo95": 0.2, "eval/accuracy_hi95": 0.4}]
    for step, seconds in enumerate(rollout_s, start=1):
        row = {"step": step, "reward/mean": 0.1 * step, "time/rollout_s": seconds}
        row |= {"throughput/rollout_tok_s": 100.0, "correction/weight_min": ratio}
        row |= {"correction/weight_max": 1.0, "mismatch/ratio_min": 1.0, "mismatch/ratio_max": 1.0}
        if name.startswith("speculative"):
            row |= {"spec/accept/mean": 0.8, "spec/tokens_per_verify": 3.0}
        rows.append(row)
    rows[-1] |= {"eval/accuracy": after, "eval/accuracy_lo95": after - 0.1}
    rows[-1] |= {"eval/accuracy_hi95": after + 0.1, "eval/delta": after - 0.3}
    rows[-1] |= {"eval/delta_lo95": after - 0.35, "eval/delta_hi95": after - 0.25}
    (runs_dir / name).mkdir(parents=True)
    (runs_dir / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_table_arithmetic_on_hand_written_metrics(tmp_path):
    _write(tmp_path, "dense_s0", [10.0, 20.0, 40.0], after=0.5)
    _write(tmp_path, "speculative_s0", [5.0, 30.0, 10.0], after=0.45, ratio=0.99995)
    _write(tmp_path, "dense_s1", [8.0, 8.0])  # its pair not started: no ratio
    runs = [table.summarize_run(tmp_path, n, 3) for n in ("dense_s0", "speculative_s0")]
    runs.append(table.summarize_run(tmp_path, "dense_s1", 3))
    spec = runs[1]
    assert (spec.arm, spec.seed, spec.steps_logged) == ("speculative", "0", 3)
    assert spec.rollout_s == {1: 5.0, 2: 30.0, 3: 10.0} and spec.reward == pytest.approx(0.2)
    assert spec.acceptance == pytest.approx(0.8) and spec.tokens_per_verify == 3.0
    assert spec.worst_ratio == pytest.approx(5e-5) and runs[0].worst_ratio == 0.0
    assert table.step_ratios(runs) == {1: {"0": 0.5}, 2: {"0": 1.5}, 3: {"0": 0.25}}
    ratios = table.format_step_ratios(runs)
    assert "| 2 | 1.50 | 1.50 |" in ratios
    assert "| all (3 pairs) |  | 0.75 (0.25 to 1.50) |" in ratios
    line = table.format_runs(runs).splitlines()[3]
    assert line.startswith("| speculative_s0 | 3/3 | 0.300 (0.200 to 0.400) | 0.450 (0.350")
    assert line.endswith("| 0.200 | 15.0 | 100.0 | 0.800 | 3.00 | 5.0e-05 |")
    arms = table.format_arms(runs)  # dense_s1 (2 of 3 steps) is left out of its arm
    assert "| dense | 1 | 0.500 (0.500 to 0.500) | +0.200 (+0.200 to +0.200) |" in arms
    assert "| speculative | 1 | 0.450 (0.450 to 0.450) |" in arms


def test_report_builds_the_tables_from_the_copies_alone(tmp_path):
    root, docs = tmp_path / "runs", tmp_path / "docs"
    _write(root, "dense_s0", [10.0, 20.0])
    _write(root, "speculative_s0", [5.0, 10.0])
    argv = ["--root", str(root), "--docs", str(docs), "--seeds", "0", "--report"]
    assert study.main([*argv, "--", "rl.steps=2"]) == 0
    for name in ("dense_s0", "speculative_s0"):
        assert (docs / "runs" / name / "metrics.jsonl").read_bytes() == (
            root / name / "metrics.jsonl"
        ).read_bytes()
    text = (docs / "README.md").read_text()
    block = text[text.index(TABLE_BEGIN) : text.index(TABLE_END)].split("\n", 2)[2]
    assert "| 1 | 0.50 | 0.50 |" in block and "| 2 | 0.50 | 0.50 |" in block
    shutil.rmtree(root)  # from the repository alone: the copies
    assert study.main([*argv, "--", "rl.steps=2"]) == 0
    again = (docs / "README.md").read_text()
    assert again[again.index(TABLE_BEGIN) : again.index(TABLE_END)].split("\n", 2)[2] == block


def test_the_committed_table_regenerates_from_the_committed_runs(tmp_path):
    """docs/speculative/README.md's table is what `--report` makes of docs/speculative/runs
    alone (the study ran at rl.steps=3: docs/speculative/README.md says why), no run dir."""
    docs = REPO / "docs" / "speculative"
    copy = tmp_path / "speculative"
    shutil.copytree(docs / "runs", copy / "runs")
    shutil.copy(docs / "README.md", copy / "README.md")
    argv = ["--root", str(tmp_path / "no_run_dirs"), "--docs", str(copy), "--report"]
    assert study.main([*argv, "--", "rl.steps=3"]) == 0

    def block(path):
        text = path.read_text()
        return text[text.index(TABLE_BEGIN) : text.index(TABLE_END)].split("\n", 2)[2]

    assert block(copy / "README.md") == block(docs / "README.md")
    assert {"dense_s0", "speculative_s0"} <= {p.name for p in (copy / "runs").iterdir()}
