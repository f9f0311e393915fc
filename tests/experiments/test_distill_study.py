"""sparrow.experiments.distill_study on the tiny preset (base and adapter arm, one seed, 2 steps,
theta frozen): run dirs and final checkpoints, the files copied into the docs folder, the offline
tail at the base run's settled budgets, and a table regenerated from the docs folder alone. Plus
the table's arithmetic on hand-written metrics."""

import json
import shutil

import pytest

from sparrow.experiments import distill_study
from sparrow.experiments import distill_table as table
from sparrow.experiments.distill_tail import settled_budgets
from sparrow.experiments.study_files import TABLE_BEGIN, TABLE_END

TINY = [
    "rl.steps=2",
    "rl.eval.every=0",
    "rollout.engine.page_size=4",  # the tiny prompts span ~12-16 pages of 4 tokens: sparse decoding
    "schedule.budgets_pages=[3]",
    "distill.lambda_kl=1.0",
    "distill.lr_factor=100",
]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("distill_study")
    root, docs = tmp / "runs", tmp / "docs"
    argv = ["--preset", "tiny", "--seeds", "0", "--root", str(root), "--docs", str(docs)]
    argv += ["--tail-prompts", "2", "--tail-samples", "2", "--", *TINY]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        assert distill_study.main(argv) == 0
    return root, docs, argv


def test_both_arms_run_with_theta_frozen_and_their_files_are_copied(study):
    root, docs, _ = study
    for name in ("base_s0", "adapter_s0"):
        assert (root / name / "checkpoints" / "step_000002" / "COMPLETE").is_file()
        copied = docs / "runs" / name / "metrics.jsonl"
        assert copied.read_text() == (root / name / "metrics.jsonl").read_text()
        rows = [json.loads(x) for x in copied.read_text().splitlines()]
        assert [r["update/policy_frozen"] for r in rows] == [1.0, 1.0]
        assert all(r["rollout/sparse_tokens"] > 0 for r in rows)
        config = json.loads((docs / "runs" / name / "run_config.json").read_text())
        assert config["rl"]["update_policy"] is False and config["seed"] == 0
    metrics = (root / "adapter_s0" / "metrics.jsonl").read_text().splitlines()
    adapter = [json.loads(x) for x in metrics]
    assert all("distill/kl_topk" in r for r in adapter)


def test_tail_is_paired_at_the_base_runs_budgets(study):
    root, docs, _ = study
    tail = json.loads((docs / "runs" / "adapter_s0" / "tail.json").read_text())
    assert tail["budgets_from"] == "base_s0"
    assert tail["budgets_pages"] == settled_budgets(root / "base_s0")
    archived = json.loads((docs / "runs" / "base_s0" / "settled_budgets.json").read_text())
    assert archived["budgets_pages"] == tail["budgets_pages"]
    assert not (docs / "runs" / "base_s0" / "tail.json").exists()
    for sampled_by in ("base", "adapter"):
        part = tail[f"sampled_by_{sampled_by}"]
        assert part["sparse_tokens"] > 0
        base, adapted = part["scored_base"], part["scored_adapter"]
        # The same tokens scored both ways: the same bins with the same counts.
        assert [(b["bin_index"], b["count"]) for b in base] == [
            (b["bin_index"], b["count"]) for b in adapted
        ]
        assert sum(b["count"] for b in base) == part["tokens"]
        # A trained adapter changes the sparse policy: the acceptance differs somewhere.
        assert any(abs(b["mean"] - a["mean"]) > 1e-6 for b, a in zip(base, adapted, strict=True))


def test_rerun_skips_finished_runs_and_tails_and_the_table_comes_from_docs(study):
    root, docs, argv = study
    tail_before = (docs / "runs" / "adapter_s0" / "tail.json").read_text()
    assert distill_study.main(argv) == 0
    lines = (root / "status.jsonl").read_text().splitlines()
    assert [json.loads(x)["status"] for x in lines[-2:]] == ["skipped", "skipped"]
    assert (docs / "runs" / "adapter_s0" / "tail.json").read_text() == tail_before
    # The base run finished in an earlier checkout: its run dir is gone, and the adapter run's
    # tail comes from the budgets archived with its metrics.
    shutil.rmtree(root / "base_s0")
    (docs / "runs" / "adapter_s0" / "tail.json").unlink()
    assert distill_study.main(argv) == 0
    lines = [json.loads(x) for x in (root / "status.jsonl").read_text().splitlines()]
    assert [(x["run"], x["status"]) for x in lines[-2:]] == [
        ("base_s0", "skipped"),
        ("adapter_s0", "skipped"),
    ]
    assert lines[-2]["detail"] == f"archived in {docs / 'runs' / 'base_s0'}"
    assert not (root / "base_s0").exists()  # not run again
    tail = json.loads((docs / "runs" / "adapter_s0" / "tail.json").read_text())
    assert tail["budgets_pages"] == json.loads(tail_before)["budgets_pages"]
    shutil.rmtree(root)  # a fresh checkout: both runs are archived, nothing runs
    assert distill_study.main(argv) == 0
    assert not (root / "base_s0").exists() and not (root / "adapter_s0").exists()
    # the table needs the docs folder only
    readme = table.write_distill_report(docs, steps=2).read_text()
    assert "| adapter_s0 | 2 |" in readme and "| base_s0 | 2 |" in readme
    assert "| adapter_s0 | " in readme.split("Held-out tail")[1]


def _write(run_dir, rows, tail=None):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if tail is not None:
        (run_dir / "tail.json").write_text(json.dumps(tail))


def _bins(p5s, means, counts):
    return [
        {"bin_index": 6 + i, "start_token": 768 + 128 * i, "end_token": 896 + 128 * i,
         "count": n, "mean": m, "p5": p}
        for i, (p, m, n) in enumerate(zip(p5s, means, counts, strict=True))
    ]  # fmt: skip


def test_summary_and_tables_on_hand_written_metrics(tmp_path):
    rows = []
    for step in range(1, 11):
        row = {"step": step, "rollout/sparse_tokens": 9000 + step, "rollout/tokens": 9216}
        row |= {"kv_read_ratio": 0.3 if step <= table.SETTLED_AFTER else 0.5 + 0.01 * step}
        row |= {"distill/kl_topk": 0.1 - 0.005 * step, "accept/p5_min": 0.8 + 0.01 * step}
        # step 4 slowed tenfold by another process: in the sum, not in the median
        row |= {"time/step_s": 3600.0 if step == 4 else 360.0, "schedule/budget_pages/bin6": 24}
        row |= {"schedule/budget_pages/bin7": 28}
        rows.append(row)
    tail = {"budgets_pages": [24, 28]}
    for sampled_by in ("base", "adapter"):
        tail[f"sampled_by_{sampled_by}"] = {
            "scored_base": _bins([0.80, 0.75], [0.90, 0.88], [500, 900]),
            "scored_adapter": _bins([0.84, 0.79], [0.92, 0.90], [500, 900]),
        }
    _write(tmp_path / "runs" / "adapter_s0", rows, tail)
    run = table.summarize(tmp_path / "runs" / "adapter_s0")
    assert run.arm == "adapter" and run.steps == 10 and run.budgets == [24, 28]
    assert run.kv_read == pytest.approx([0.56, 0.57, 0.58, 0.59, 0.60])  # after step 5 only
    assert run.kl_first == pytest.approx(0.085) and run.kl_last == pytest.approx(0.06)
    assert run.p5_min == pytest.approx(0.855)  # median of 0.81 ... 0.90
    assert run.step_h == pytest.approx(1.9) and run.step_s_median == 360.0
    runs_table = table.format_runs([run])
    assert "| adapter_s0 | 10 | 9,006 (9,001) | 9,216 | 0.580 ± 0.016 (5) | 24 28 |" in runs_table
    assert "0.0850 -> 0.0600 | 360 | 1.90 |" in runs_table
    tails = table.format_tails([run])
    row = "| adapter_s0 | 24 28 | base | 768-895 | 500 | 0.800 -> 0.840 | 0.900 -> 0.920 |"
    assert row in tails
    _write(tmp_path / "runs" / "base_s0", [{"step": 1, "kv_read_ratio": 0.9}])  # unfinished
    arms = table.format_arms([run, table.summarize(tmp_path / "runs" / "base_s0")], steps=10)
    assert "| adapter | 1 | 0.580 (0.580-0.580) | 9,006 | 0.0850 -> 0.0600 | 360 | 1.90 |" in arms
    assert "| base |" not in arms


def _table_lines(readme: str) -> list[str]:
    block = readme.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0]
    return [line for line in block.splitlines() if not line.startswith("Generated by")]


def test_the_committed_table_regenerates_from_the_committed_runs(tmp_path):
    """docs/distill/README.md's table is what distill_table makes of docs/distill/runs alone:
    every run of the study (three seeds per arm, 20 steps each) is in the repo."""
    docs = table.REPO / "docs" / "distill"
    names = sorted(d.name for d in (docs / "runs").iterdir() if d.is_dir())
    assert names == [f"{arm}_s{seed}" for arm in ("adapter", "base") for seed in (0, 1, 2)]
    copy = tmp_path / "distill"
    shutil.copytree(docs / "runs", copy / "runs")
    shutil.copy(docs / "README.md", copy / "README.md")
    regenerated = table.write_distill_report(copy, steps=20).read_text()
    assert _table_lines(regenerated) == _table_lines((docs / "README.md").read_text())
    assert all(table.summarize(docs / "runs" / n).steps == 20 for n in names)
