"""The dashboard as code: the panels of sparrow/train/logs/panels.py checked against a real smoke
run's metrics.jsonl, the W&B workspace built from them offline (stopping before the save, which
needs network and a key), and sparrow-report drawing the same panels in the same order.

The smoke run is tests/conftest.py's `smoke_run` (evaluation, measured speedup, TensorBoard and
W&B offline on). Saving for real: `sparrow-report RUN_DIR --wandb-workspace ENTITY/PROJECT`.
"""

import importlib.util
import json
from pathlib import Path

import matplotlib

from sparrow.cli import report
from sparrow.cli.report_runs import load_runs
from sparrow.cli.wandb_workspace import HEATMAP_PRESET, build_workspace
from sparrow.train.dynamic_sampling import SAMPLING_METRICS
from sparrow.train.logs.metrics_logger import read_metrics
from sparrow.train.logs.panels import PANELS, TAU_KEY, decoded_bins, layout, matches, resolve

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RUN = ROOT / "docs" / "default_run"


def missing_keys(panels, keys: set[str]) -> list[str]:
    """'panel: pattern' for every key pattern of `panels` that no key of a run matches."""
    out = []
    for panel in panels:
        patterns = [
            *panel.keys,
            *(panel.band or ()),
            *([panel.reference] if panel.reference else []),
        ]
        out += [f"{panel.name}: {p}" for p in patterns if not any(matches(p, k) for k in keys)]
    return out


def _keys(run_dir: Path) -> set[str]:
    return {k for row in read_metrics(run_dir) for k in row}


def test_every_panel_key_is_logged_by_a_smoke_run(smoke_run):
    required = [p for p in PANELS if not p.optional]
    assert missing_keys(required, _keys(smoke_run)) == []


def test_a_renamed_metric_fails_the_key_check(smoke_run):
    rows = read_metrics(smoke_run)
    renamed = {k.replace("update/clip_frac_low", "update/clipfrac_low") for r in rows for k in r}
    assert missing_keys([p for p in PANELS if not p.optional], renamed) == [
        "clip: update/clip_frac_low"
    ]


def test_dynamic_sampling_panel_matches_the_keys_it_logs():
    """The optional panels are dynamic sampling's (rl.dynamic_sampling, off in the smoke run):
    their keys are the ones sample_step logs."""
    optional = [p for p in PANELS if p.optional]
    assert [p.name for p in optional] == ["dynamic_sampling"]
    assert missing_keys(optional, set(SAMPLING_METRICS)) == []


def test_workspace_is_built_offline_with_the_sections_and_the_tau_line(smoke_run):
    workspace = build_workspace([smoke_run], "an-entity", "a-project", "sparrow: the method")
    names = [s.name for s in workspace.sections]
    assert names == ["Tail acceptance", "Budget", "Learning", "Rollout correction", "Cost"]
    p5 = workspace.sections[0].panels[0]
    assert p5.title == "p5 acceptance"
    assert p5.y == ["accept/p5/bin0", "accept/p5/bin1", TAU_KEY]
    heatmap = workspace.sections[0].panels[1]
    assert heatmap.chart_name == HEATMAP_PRESET
    assert heatmap.query == {"summaryTable": {"tableKey": "accept/p5_heatmap"}}
    time_split = workspace.sections[-1].panels[0]
    assert time_split.plot_type == "stacked-area" and "time/step_s" not in time_split.y
    assert "time/rollout_s" in time_split.y
    # Serialised as W&B stores a saved view, with no network.
    view = json.loads(workspace._to_model().model_dump_json())
    assert "Tail acceptance" in json.dumps(view)

    # Every key a W&B panel reads is in the run's W&B files: metrics.jsonl's keys, and the
    # W&B-only histogram and heat-map table the trainer logs.
    wandb_steps = _wandb_steps(smoke_run)
    logged = {k for items in wandb_steps.values() for k in items}
    logged |= {k.removesuffix("/_type") for k in logged}  # histograms, tables: KEY/_type, ...
    for section in workspace.sections:
        for panel in section.panels:
            read = panel.y if hasattr(panel, "y") else [panel.query["summaryTable"]["tableKey"]]
            assert set(read) <= logged, read
    assert wandb_steps[2]["accept/p5_heatmap/_type"] == "table-file"
    assert wandb_steps[2]["accept/p5_heatmap/nrows"] == 2 * 2  # 2 steps x 2 bins


def test_report_and_workspace_show_one_list_of_panels(smoke_run, tmp_path):
    workspace = build_workspace([smoke_run], "e", "p", "w")
    titles = [
        getattr(p, "title", None) or p.chart_strings["title"]
        for s in workspace.sections
        for p in s.panels
    ]
    written = report.render([smoke_run], tmp_path)
    assert written[-1].name == "report.png"
    assert [p.stem.replace("_", " ") for p in written[:-1]] == titles
    keys, bins = _keys(smoke_run), decoded_bins(read_metrics(smoke_run))
    assert titles == [p.name.replace("_", " ") for _, ps in layout(keys, bins) for p, _ in ps]


def test_saving_stops_with_one_line_without_a_key(smoke_run, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    assert report.main([str(smoke_run), "--wandb-workspace", "an-entity/a-project"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs an API key: run `wandb login`" in err
    assert report.main([str(smoke_run), "--wandb-workspace", "no-project"]) == 2
    assert "expected ENTITY/PROJECT" in capsys.readouterr().err

    # With a key the workspace is built and handed to W&B's save, which needs the network.
    import wandb_workspaces.workspaces as ws

    saved = []

    def offline_save(self):
        saved.append(self)
        raise ConnectionError("no network here")

    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setattr(ws.Workspace, "save_as_new_view", offline_save)
    assert report.main([str(smoke_run), "--wandb-workspace", "an-entity/a-project"]) == 2
    assert "W&B did not save the workspace for an-entity/a-project" in capsys.readouterr().err
    assert [s.name for s in saved[0].sections][0] == "Tail acceptance"
    assert (saved[0].entity, saved[0].project) == ("an-entity", "a-project")


def test_only_bins_that_decoded_are_drawn_one_colour_each_legend_outside(tmp_path):
    import matplotlib.pyplot as plt

    from sparrow.cli.panel_drawing import Palette, draw

    runs, keys, bins = load_runs([DEFAULT_RUN], bin_tokens=32)
    assert sum(k.startswith("schedule/budget_pages/bin") for k in keys) == 13
    # The completions: positions 383-447 (the shortest prompts end at 383); bins 0-10 are prompt.
    assert bins == {11, 12, 13}
    panels = {p.name: p for p in PANELS}
    budget = ["schedule/budget_pages/bin11", "schedule/budget_pages/bin12"]
    assert resolve(panels["budget"], keys, bins) == budget

    fig, ax = plt.subplots(layout="constrained")
    assert draw(
        ax,
        panels["p5_acceptance"],
        resolve(panels["p5_acceptance"], keys, bins),
        runs,
        Palette([11, 12, 13]),
    )
    fig.canvas.draw()
    lines = [line for line in ax.get_lines() if line.get_label().startswith("accept/p5")]
    assert [line.get_label() for line in lines] == [
        "accept/p5 pos 352-383",
        "accept/p5 pos 384-415",
        "accept/p5 pos 416-447",
    ]
    assert len({line.get_color() for line in lines}) == 3
    tau = [line for line in ax.get_lines() if line.get_label().startswith("tau")]
    assert len(tau) == 1 and tau[0].get_ydata()[0] == 0.86
    legend = ax.get_legend().get_window_extent()
    assert legend.y1 < ax.get_window_extent().y0  # below the axes, not over the lines
    plt.close(fig)


def _wandb_steps(run_dir: Path) -> dict[int, dict]:
    path = ROOT / "tests" / "train" / "wandb_files.py"
    spec = importlib.util.spec_from_file_location("wandb_files", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.wait_until_written(run_dir)  # wandb's service may still be writing
    return module.logged_steps(run_dir)
