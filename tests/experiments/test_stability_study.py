"""sparrow.experiments.stability_study on the tiny preset (2 runs x 2 steps): run dirs and final
checkpoints, skip-on-rerun, resume of an interrupted run, the overlay PNGs, and a table whose
numbers are the ones in metrics.jsonl. Plus the table's arithmetic on hand-written metrics."""

import json
import shutil
from pathlib import Path

import pytest

from sparrow.experiments import stability_study
from sparrow.experiments import stability_table as table
from sparrow.experiments.study_files import TABLE_BEGIN, TABLE_END, rows_by_step


@pytest.fixture(scope="module")
def study():
    return stability_study


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _status(root: Path) -> list[tuple[str, str]]:
    lines = (root / "status.jsonl").read_text().splitlines()
    return [(r["run"], r["status"]) for r in map(json.loads, lines)]


def _table_row(readme: Path, name: str) -> list[str]:
    line = next(x for x in readme.read_text().splitlines() if x.startswith(f"| {name} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


@pytest.fixture(scope="module")
def tiny_study(study, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("study")
    root, docs = tmp / "runs", tmp / "docs"
    argv = [
        "--preset",
        "tiny",
        "--arms",
        "dense,tau086",
        "--jobs",
        "2",  # both runs at once: the parallel path (one thread each)
        "--root",
        str(root),
        "--docs",
        str(docs),
        "--",
        "rl.save_every=1",  # a step-1 checkpoint to resume from
        "monitor.speedup_every=2",  # a measured speedup on the last step of the sparse run
        "monitor.noise_floor_fraction=0",
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("SPARROW_CACHE", str(tmp / "cache"))
        assert study.main(argv) == 0
        first = {name: _rows(root / name) for name in ("dense", "tau086")}
        readme_first = (docs / "README.md").read_text()
        assert study.main(argv) == 0  # everything done: both skipped
        skipped = _status(root)[-2:]
        unchanged = {name: _rows(root / name) == first[name] for name in first}
        # Interrupted after step 1: the final checkpoint is gone, the step-1 one remains.
        shutil.rmtree(root / "tau086" / "checkpoints" / "step_000002")
        assert study.main(argv) == 0
    return {
        "root": root,
        "docs": docs,
        "first": first,
        "readme_first": readme_first,
        "skipped": skipped,
        "unchanged": unchanged,
    }


def test_runs_have_their_dirs_and_final_checkpoints(tiny_study):
    root = tiny_study["root"]
    for name in ("dense", "tau086"):
        assert (root / name / "checkpoints" / "step_000002" / "COMPLETE").is_file()
        assert max(r["step"] for r in tiny_study["first"][name]) == 2
    dense_cfg = tiny_study["first"]["dense"]
    assert not any("kv_read_ratio" in r and r["kv_read_ratio"] < 1.0 for r in dense_cfg)
    assert ("dense", "done") in _status(root) and ("tau086", "done") in _status(root)


def test_rerun_skips_finished_runs(tiny_study):
    # Two runs at a time (--jobs 2): the two status lines come in either order.
    assert sorted(tiny_study["skipped"]) == [("dense", "skipped"), ("tau086", "skipped")]
    assert tiny_study["unchanged"] == {"dense": True, "tau086": True}


def test_interrupted_run_resumes_from_its_checkpoint(tiny_study):
    root = tiny_study["root"]
    last = _status(root)[-3:]  # --jobs 2: "dense skipped" may come before or after the start
    assert sorted(last) == [("dense", "skipped"), ("tau086", "done"), ("tau086", "started")]
    assert last.index(("tau086", "started")) < last.index(("tau086", "done"))
    assert "resumed from" in (root / "tau086" / "console.log").read_text()
    assert (root / "tau086" / "checkpoints" / "step_000002" / "COMPLETE").is_file()
    steps = [r["step"] for r in _rows(root / "tau086")]
    # Step 2 was trained again after the interruption; the resumed run cut metrics.jsonl back to
    # step 1 first, so each step appears once.
    assert steps == [0, 1, 2]


def test_report_plots_exist(tiny_study):
    plots = tiny_study["docs"] / "plots"
    for name in ("reward", "eval_accuracy", "kv_read_ratio", "p5_acceptance"):
        assert (plots / f"{name}.png").stat().st_size > 0


def test_table_numbers_come_from_metrics(study, tiny_study):
    root, readme = tiny_study["root"], tiny_study["docs"] / "README.md"
    for name in ("dense", "tau086"):
        rows = rows_by_step(root / name)
        last = rows[2]
        cells = _table_row(readme, name)
        assert cells[2] == "2/2"
        assert cells[3] == (
            f"{last['eval/accuracy']:.3f} ({last['eval/accuracy_lo95']:.3f}-"
            f"{last['eval/accuracy_hi95']:.3f}) at step 2"
        )
        ratios = [rows[s]["kv_read_ratio"] for s in (1, 2)]
        assert cells[6] == f"{sum(ratios) / 2:.3f}"
    assert _table_row(readme, "dense")[8] == "1.00x reference"
    measured = rows_by_step(root / "tau086")[2]["speedup/measured"]
    assert _table_row(readme, "tau086")[8] == f"{measured:.2f}x measured (1 steps)"
    assert "Generated by `sparrow.experiments.stability_study`" in readme.read_text()


def _write(run_dir: Path, rows: list[dict]) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_speedup_falls_back_to_tok_s_and_resumed_steps_keep_last_row(study, tmp_path):
    _write(
        tmp_path / "dense",
        [{"step": 1, "rollout/tokens": 100.0, "time/rollout_s": 10.0, "kv_read_ratio": 1.0}],
    )
    evaluation = {"eval/accuracy": 0.25, "eval/accuracy_lo95": 0.1, "eval/accuracy_hi95": 0.5}
    _write(
        tmp_path / "tau080",
        [
            {"step": 0, **evaluation},
            {"step": 1, "rollout/tokens": 90.0, "time/rollout_s": 9.0, "kv_read_ratio": 0.9},
            # a step re-logged after a resume: the later row counts
            {"step": 1, "rollout/tokens": 60.0, "time/rollout_s": 3.0, "kv_read_ratio": 0.5},
        ],
    )
    dense_tok_s = table._rollout_tok_s(rows_by_step(tmp_path / "dense"))
    assert dense_tok_s == 10.0
    s = table.summarize(tmp_path, study.ARMS[3], 2, dense_tok_s)
    assert s.speedup == pytest.approx(2.0) and s.speedup_source == "tok/s vs dense"
    assert s.kv_read_ratio == 0.5 and s.steps_logged == 1
    assert s.accuracy == (0.25, 0.1, 0.5) and s.eval_step == 0
    assert "| tau080 | online, tau 0.80 | 1/2 | 0.250 (0.100-0.500) at step 0 |" in (
        table.format_table([s])
    )


def test_readme_prose_is_kept_and_only_the_table_block_replaced(study, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "README.md").write_text(
        f"# Study\nprose before\n{TABLE_BEGIN}\nold table\n{TABLE_END}\nprose after\n"
    )
    _write(tmp_path / "runs" / "dense", [{"step": 1, "kv_read_ratio": 1.0, "reward/mean": 0.5}])
    table.write_report(tmp_path / "runs", [study.ARMS[0]], {"dense": 2}, docs)
    text = (docs / "README.md").read_text()
    assert "prose before" in text and "prose after" in text and "old table" not in text
    assert "| dense | dense rollouts | 1/2 |" in text and "Incomplete runs: dense." in text


def test_bad_override_fails_before_anything_runs(study, tmp_path):
    argv = ["--preset", "tiny", "--root", str(tmp_path / "r"), "--", "rl.nonexistent=1"]
    assert study.main(argv) == 2
    assert not (tmp_path / "r").exists()
