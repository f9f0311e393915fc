"""sparrow.experiments.pipeline_study: its arms set the staleness they name (the extra rollout-rank
arm, behind its flag, is a 2-rank launch of torchrun's agent), seed-major runs
seeded by `seed=S` alone; the table and sentence from hand-written metrics (the gain, the per-seed
difference, the count of intervals above 0); and a tiny study of real sparrow-train processes
(slow) whose report regenerates from the copied metrics alone."""

import json
import os
from pathlib import Path

import pytest

from sparrow.cli.config_loader import load_config
from sparrow.experiments import pipeline_study as study
from sparrow.experiments import pipeline_table as table
from sparrow.experiments.study_files import TABLE_BEGIN, TABLE_END

ARMS = {arm.name: arm for arm in study.ARMS}


@pytest.mark.parametrize(("arm", "staleness"), [("sync", 0), ("async1", 1)])
def test_each_arm_sets_its_staleness(arm, staleness):
    cfg = load_config(["preset=tiny", *ARMS[arm].overrides])
    assert cfg.rl.async_rollout.staleness == staleness


def test_runs_are_seed_major_and_seeded_by_seed_alone():
    runs = study.STUDY.runs(list(ARMS), [0, 1, 2])
    assert [r.name for r in runs] == [f"{a}_s{s}" for s in (0, 1, 2) for a in ARMS]
    for run in runs:
        assert f"seed={run.name.rsplit('_s', 1)[1]}" in run.overrides


def _write_run(root: Path, name: str, before: float, gain: tuple, staleness: float) -> None:
    """A finished 2-step run: evaluations at steps 0 and 2, two training rows."""
    rows = [
        {"step": 0, "eval/accuracy": before},
        {"step": 1, "reward/mean": 0.2, "async/staleness": staleness, "accept/p5_min": 0.8,
         "kv_read_ratio": 0.5, "time/step_s": 10.0},
        {"step": 2, "reward/mean": 0.4, "async/staleness": staleness, "accept/p5_min": 0.9,
         "kv_read_ratio": 0.7, "time/step_s": 20.0, "eval/accuracy": before + gain[0],
         "eval/accuracy_lo95": before, "eval/accuracy_hi95": before + 0.2,
         "eval/delta": gain[0], "eval/delta_lo95": gain[1], "eval/delta_hi95": gain[2]},
    ]  # fmt: skip
    (root / name).mkdir(parents=True)
    (root / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_table_and_sentence_from_hand_written_metrics(tmp_path):
    root, docs = tmp_path / "runs", tmp_path / "docs"
    _write_run(root, "sync_s0", 0.3, (0.30, 0.20, 0.40), 0.0)
    _write_run(root, "async1_s0", 0.3, (0.20, -0.01, 0.41), 1.0)
    _write_run(root, "sync_s1", 0.4, (0.10, 0.05, 0.15), 0.0)
    _write_run(root, "async1_s1", 0.4, (0.30, 0.10, 0.50), 1.0)
    runs = study.STUDY.runs(list(ARMS), [0, 1])
    readme = table.write_pipeline_report(root, runs, {r.name: 2 for r in runs}, docs)
    text = readme.read_text()
    block = text[text.index(TABLE_BEGIN) : text.index(TABLE_END)]
    # gains: async1 0.20, 0.30 (mean 0.25); sync 0.30, 0.10 (mean 0.20); differences -0.10, +0.20
    assert "staleness 1 gains +0.250 (+0.200 to +0.300)" in block
    assert "against +0.200 (+0.100 to +0.300) for the synchronous loop" in block
    assert "is +0.050 (-0.100 to +0.200)" in block
    assert "above 0 in 1 of 2 staleness-1 run(s)" in block
    assert "| async1 | 2 | +0.250 (+0.200 to +0.300) | 1/2 |" in block
    assert "| sync | 2 | +0.200 (+0.100 to +0.300) | 2/2 |" in block
    # p5 min is the median over steps (0.85), the step seconds their mean (15.0)
    assert "| async1_s1 | 2/2 | 0.400 | 0.700 (0.400 to 0.600) | +0.300 (+0.100 to +0.500) " \
        "| 1.00 | 0.850 | 0.60 | 15.0 |" in block  # fmt: skip
    # regenerated from the copies alone, the same table
    for name in ("sync_s0", "async1_s1"):
        assert (docs / "runs" / name / "metrics.jsonl").read_bytes() == (
            root / name / "metrics.jsonl"
        ).read_bytes()


def test_a_split_run_is_checked_against_its_one_process_twin(tmp_path):
    """rollout1_sN against async1_sN: the one in docs/twins/ when there is one (a run made beside
    it on another host), else runs/; timings and the push's bytes aside, every value counts."""
    docs = tmp_path / "docs"
    _write_run(docs / "runs", "async1_s0", 0.3, (0.2, 0.1, 0.3), 1.0)
    _write_run(docs / "runs", "rollout1_s0", 0.3, (0.2, 0.1, 0.3), 1.0)
    _write_run(docs / "runs", "async1_s1", 0.3, (0.2, 0.1, 0.3), 1.0)
    _write_run(docs / "runs", "rollout1_s1", 0.3, (0.2, 0.1, 0.3), 1.0)
    _write_run(docs / "twins", "async1_s1", 0.3, (0.25, 0.1, 0.3), 1.0)  # one value differs
    path = docs / "runs" / "rollout1_s0" / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1] |= {"time/step_s": 99.0, "sync/push_bytes": 8.0}  # timings and the push: aside
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = table.format_twins(docs, ["async1_s0", "rollout1_s0", "rollout1_s1", "rollout1_s2"])
    assert "| rollout1_s0 | runs/async1_s0 | 18 | 0 |" in text
    assert "| rollout1_s1 | twins/async1_s1 | 18 | 2 |" in text  # eval/delta and the accuracy
    assert "rollout1_s2" not in text  # not run
    assert table.format_twins(docs, ["async1_s0"]) == ""


def test_no_finished_seed_supports_no_sentence(tmp_path):
    _write_run(tmp_path, "sync_s0", 0.3, (0.3, 0.2, 0.4), 0.0)
    runs = [table.summarize_run(tmp_path, "sync_s0", 2)]
    assert table.sentence(runs).startswith("No seed has both arms finished")


@pytest.mark.slow
def test_tiny_study_runs_both_arms_and_reports(tmp_path):
    root, docs = tmp_path / "runs", tmp_path / "docs"
    argv = ["--root", str(root), "--docs", str(docs), "--seeds", "0"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        code = study.main(
            [*argv, "--", "preset=tiny", "rl.steps=2", "rl.eval.every=2", "rl.eval.num_prompts=8"]
        )
    assert code == 0
    summaries = {n: table.summarize_run(docs / "runs", n, 2) for n in ("sync_s0", "async1_s0")}
    assert summaries["sync_s0"].finished and summaries["async1_s0"].finished
    assert summaries["sync_s0"].staleness == 0.0
    # step 1 draws from the initial weights either way; step 2's rows are one version behind
    assert summaries["async1_s0"].staleness == pytest.approx(0.5)
    assert "Over 1 seed(s)" in (docs / "README.md").read_text()


def test_the_rollout_rank_arm_is_a_2_rank_launch(monkeypatch, tmp_path):
    from sparrow.experiments import study_runs

    cfg = load_config(["preset=tiny", *ARMS["rollout1"].overrides])
    assert (cfg.rl.async_rollout.staleness, cfg.cluster.rollout_ranks) == (1, 1)
    assert ARMS["rollout1"].flag and study.STUDY.runs(["sync", "async1"], [0]) == [
        r for r in study.STUDY.runs(list(ARMS), [0]) if r.name != "rollout1_s0"
    ]
    launched = []

    class Launch:  # records the command instead of running it
        def __init__(self, cmd, **kwargs):
            launched.append((cmd, kwargs["env"]))

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(study_runs.subprocess, "Popen", Launch)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    (run,) = study.STUDY.runs(["rollout1"], [0])
    study_runs._run_one(tmp_path, run, ["preset=tiny"], 2)
    ((cmd, env),) = launched
    assert cmd[1:7] == ["-m", "sparrow.cli.launcher", "--standalone", "--nproc-per-node=2", "-m",
                        "sparrow.cli.train"]  # fmt: skip
    assert "cluster.rollout_ranks=1" in cmd and "seed=0" in cmd
    assert env["OMP_NUM_THREADS"] == str(os.cpu_count())  # as a one-process run's threads
