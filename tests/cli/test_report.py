"""sparrow-report: PNG panels from metrics.jsonl, one line per run when several are overlaid."""

import json

from sparrow.cli import report


def _write_run(path, steps: int, p5: float):
    path.mkdir(parents=True)
    with open(path / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            row = {
                "step": step,
                "reward/mean": 0.1 * step,
                "accept/p5/bin0": p5,
                "accept/p5/bin1": p5 - 0.05,
                "noise_floor/p5/bin0": 1.0,
                "controller/tau": 0.86,
                "schedule/budget_pages/bin0": 4 + step,
                "kv_read_ratio": 0.5,
                "speedup/predicted": 1.8,
                "speedup/measured": 1.6,
                "accept/hist20": [0] * 17 + [1, 5, 50],
            }
            f.write(json.dumps(row) + "\n")
        f.write('{"step": 99, "torn')  # a run killed mid-write: the torn line is skipped


def test_report_draws_the_panels_that_have_data(tmp_path, capsys):
    _write_run(tmp_path / "dense", 3, 0.95)
    _write_run(tmp_path / "sparse", 3, 0.88)
    out = tmp_path / "report"
    assert report.main([str(tmp_path / "dense"), str(tmp_path / "sparse"), "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    for panel in ("reward", "p5_acceptance", "noise_floor", "budget", "kv_read_ratio", "speedup"):
        assert f"{panel}.png" in names
    assert "acceptance_histogram.png" in names
    assert "eval_accuracy.png" not in names  # no data, no empty plot
    assert "report.png" in names  # every panel on one page
    assert all((out / n).stat().st_size > 5000 for n in names)
    assert len(capsys.readouterr().out.splitlines()) == len(names)


def test_report_without_metrics_is_a_clear_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "metrics.jsonl not found" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text("")
    assert report.main([str(tmp_path)]) == 2
    assert "no metrics rows" in capsys.readouterr().err


def test_bin_series_are_labelled_by_their_positions(tmp_path):
    from sparrow.cli.panel_drawing import _label
    from sparrow.cli.report_runs import RunData, stored_bin_tokens

    _write_run(tmp_path / "run", 2, 0.9)
    stored = {"schedule": {"bin_tokens": 2048}}
    (tmp_path / "run" / "run_config.json").write_text(json.dumps(stored))
    bins = stored_bin_tokens(tmp_path / "run")
    assert bins == 2048
    run = RunData("", [], bins)
    assert _label(run, "accept/p5/bin0") == "accept/p5 pos 0-2047"
    assert _label(run, "schedule/budget_pages/bin3") == "schedule/budget_pages pos 6144-8191"
    assert _label(run, "reward/mean") == "reward/mean"
    assert stored_bin_tokens(tmp_path) is None  # no stored config: bins by index
    assert _label(RunData("", [], None), "accept/p5/bin1") == "accept/p5 bin 1"
    assert _label(RunData("dense", [], None), "kv_read_ratio") == "dense kv_read_ratio"
