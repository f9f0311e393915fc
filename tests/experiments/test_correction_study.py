"""sparrow.experiments.correction_study: its arms x seeds (seed-major, `seed=S` only), each arm's
overrides valid for the config; a tiny study (2 arms x 1 seed x 2 steps, real sparrow-train
processes) whose --status, report and copied metrics work, and whose --report regenerates the
same table from the copies alone; and the table's arithmetic on hand-written metrics."""

import json
import shutil
from pathlib import Path

import pytest

from sparrow.cli.config_loader import load_config
from sparrow.experiments import correction_study as study
from sparrow.experiments import correction_table as table
from sparrow.experiments.study_files import REPO, TABLE_BEGIN, TABLE_END

ARMS = {arm.name: arm for arm in study.ARMS}


def test_runs_are_seed_major_and_seeded_by_seed_alone():
    runs = study.STUDY.runs(list(ARMS), [0, 1])
    assert [r.name for r in runs[:5]] == [f"{arm}_s0" for arm in ARMS]
    assert [r.name for r in runs[5:]] == [f"{arm}_s1" for arm in ARMS]
    for run in runs:
        seed = run.name.rsplit("_s", 1)[1]
        assert f"seed={seed}" in run.overrides
        assert not any(o.startswith("data.shuffle_seed") for o in run.overrides)


@pytest.mark.parametrize("arm", list(ARMS))
def test_each_arm_configures_what_it_says(arm):
    cfg = load_config(["preset=tiny", *ARMS[arm].overrides])
    sparse = arm != "dense"
    assert (cfg.schedule.mode, cfg.schedule.budgets_pages) == (
        ("fixed", [3]) if sparse else ("dense", cfg.schedule.budgets_pages)
    )
    mode = {"token_mask": "token_mask", "seq_mask": "seq_mask"}.get(arm, "tis")
    assert cfg.rl.correction.mode == mode
    if arm == "token_mask":
        assert (cfg.rl.correction.lo, cfg.rl.correction.hi) == study.TOKEN_MASK_BAND
    if arm == "seq_mask":
        assert (cfg.rl.correction.lo, cfg.rl.correction.hi) == study.SEQ_MASK_BAND
    assert cfg.rl.dynamic_sampling.enabled == (arm == "tis_dynamic")
    if arm == "tis_dynamic":
        assert cfg.rl.dynamic_sampling.max_rounds == study.DYNAMIC_MAX_ROUNDS


def _table_row(readme: Path, name: str) -> list[str]:
    line = next(x for x in readme.read_text().splitlines() if x.startswith(f"| {name} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def _table(readme: Path) -> str:
    """The generated block without its time stamp."""
    text = readme.read_text()
    block = text[text.index(TABLE_BEGIN) : text.index(TABLE_END)]
    return block.split("\n", 2)[2]


def test_tiny_study_runs_reports_and_regenerates_from_the_copies(tmp_path, capsys):
    root, docs = tmp_path / "runs", tmp_path / "docs"
    argv = ["--root", str(root), "--docs", str(docs), "--seeds", "0", "--arms", "tis,tis_dynamic"]
    tiny = ["--", "preset=tiny", "rl.steps=2"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        assert study.main([*argv, *tiny]) == 0
        capsys.readouterr()
        assert study.main([*argv, "--status", *tiny]) == 0
    status = capsys.readouterr().out.splitlines()
    assert status[0].startswith("tis_s0: complete, 2/2 steps logged")
    assert status[1].startswith("tis_dynamic_s0: complete, 2/2 steps logged")

    readme = docs / "README.md"
    for name in ("tis_s0", "tis_dynamic_s0"):
        copy = docs / "runs" / name / "metrics.jsonl"
        assert copy.read_bytes() == (root / name / "metrics.jsonl").read_bytes()
    rows = [
        json.loads(x)
        for x in (root / "tis_dynamic_s0" / "metrics.jsonl").read_text().split("\n")
        if x
    ]
    evals = [r for r in rows if "eval/accuracy" in r]
    cells = _table_row(readme, "tis_dynamic_s0")
    assert cells[1] == "2/2"
    assert cells[2].startswith(
        f"{evals[0]['eval/accuracy']:.3f} ({evals[0]['eval/accuracy_lo95']:.3f} to"
    )
    assert cells[3].startswith(f"{evals[-1]['eval/accuracy']:.3f}")
    drawn = [r["sampling/groups_drawn"] for r in rows if "sampling/groups_drawn" in r]
    assert len(drawn) == 2 and cells[6] == f"{sum(drawn) / 2:.1f}"  # groups drawn per step
    assert _table_row(readme, "tis_s0")[6] == "4.0"  # one round of the tiny preset's 4 prompts
    assert "| tis_dynamic | 1 |" in readme.read_text()  # the per-arm table
    assert (docs / "plots" / "accuracy.png").is_file()

    # From the repository alone: the run dirs gone, --report reads the copies.
    before = _table(readme)
    shutil.rmtree(root)
    assert study.main([*argv, "--report", *tiny]) == 0
    assert _table(readme) == before


def test_the_committed_table_regenerates_from_the_committed_runs(tmp_path):
    """docs/correction/README.md's table is what `--report` makes of docs/correction/runs alone
    (five arms x three seeds in the repo), with no run dir."""
    docs = REPO / "docs" / "correction"
    copy = tmp_path / "correction"
    shutil.copytree(docs / "runs", copy / "runs")
    shutil.copy(docs / "README.md", copy / "README.md")
    argv = ["--root", str(tmp_path / "no_run_dirs"), "--docs", str(copy), "--report"]
    assert study.main(argv) == 0
    assert sorted(p.name for p in (copy / "runs").iterdir()) == sorted(
        f"{arm}_s{seed}" for arm in ARMS for seed in (0, 1, 2)
    )
    assert _table(copy / "README.md") == _table(docs / "README.md")


def test_table_arithmetic_on_hand_written_metrics(tmp_path):
    rows = [
        {"step": 0, "eval/accuracy": 0.3, "eval/accuracy_lo95": 0.24, "eval/accuracy_hi95": 0.37}
    ]
    for step in (1, 2, 3):
        row = {"step": step, "reward/mean": 0.0, "kv_read_ratio": 0.25, "time/step_s": 60.0}
        row |= {"sampling/groups_drawn": 8.0 * step, "sampling/groups_kept": 1.0}
        row |= {"sampling/round_limit_hit": float(step > 1), "correction/truncated_frac": 0.01}
        row["update/no_signal"] = float(step == 2)
        rows.append(row)
    rows[-1] |= {"eval/accuracy": 0.4, "eval/accuracy_lo95": 0.33, "eval/accuracy_hi95": 0.47}
    rows[-1] |= {"eval/delta": 0.1, "eval/delta_lo95": 0.05, "eval/delta_hi95": 0.15}
    (tmp_path / "tis_dynamic_s0").mkdir()
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "tis_dynamic_s0" / "metrics.jsonl").write_text(text)
    run = table.summarize_run(tmp_path, "tis_dynamic_s0", steps=3, prompts_per_step=8)
    assert run.arm == "tis_dynamic" and run.steps_logged == 3
    assert run.before == (0.3, 0.24, 0.37) and run.after == (0.4, 0.33, 0.47)
    assert run.delta == (0.1, 0.05, 0.15)
    assert run.updates == 2 and run.groups_drawn == 16.0 and run.round_limit_steps == 2
    assert run.kv_read == 0.25 and run.train_min == 3.0 and run.masked is None
    line = table.format_runs([run]).splitlines()[-1]
    assert "| 0.400 (0.330 to 0.470) | +0.100 (+0.050 to +0.150) | 2 | 16.0 | 1.0 | 2 |" in line
    arms = table.format_arms([run])
    assert "| tis_dynamic | 1 | 0.400 (0.400 to 0.400) | +0.100 (+0.100 to +0.100) |" in arms
