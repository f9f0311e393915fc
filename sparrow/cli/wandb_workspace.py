"""The method's W&B workspace, defined in code with `wandb-workspaces`: the panels of
sparrow/train/logs/panels.py, in their sections and order, as `sparrow-report` draws them.

    sparrow-report runs/default --wandb-workspace ENTITY/PROJECT

Built from one or more run directories (their metrics.jsonl names the keys: per-bin charts get
the bins those runs decoded), then saved as a new saved view of the project, whose URL is
printed. Line panels plot their keys against step; tau is drawn as its own series (it is logged
every step and constant within a run: W&B line plots have no constant reference line). The p5
heat map is a custom chart (W&B's confusion-matrix preset: bin x step coloured by p5) over the
table the trainer logs as `accept/p5_heatmap`; the acceptance histogram is the per-token
`accept/histogram` over steps. `build_workspace` needs no network; `save_workspace` needs an API
key (`wandb login` or WANDB_API_KEY) and network.
"""

from pathlib import Path

from sparrow.cli.errors import UserError
from sparrow.train.logs.panels import Panel

HEATMAP_PRESET = "wandb/confusion_matrix/v1"  # a heat map over (Actual, Predicted) cells
HEATMAP_FIELDS = {"Actual": "bin", "Predicted": "step", "nPredictions": "p5"}


def build_workspace(run_dirs: list[Path], entity: str, project: str, name: str):
    """The workspace object (not saved): one section per dashboard section with data."""
    from sparrow.cli.report_runs import load_runs
    from sparrow.train.logs.panels import layout

    ws, wr = _modules()
    _, keys, bins = load_runs(run_dirs)
    sections = [
        ws.Section(name=section, panels=[_panel(wr, p, k) for p, k in panels], is_open=True)
        for section, panels in layout(keys, bins)
    ]
    return ws.Workspace(name=name, entity=entity, project=project, sections=sections)


def save_workspace(run_dirs: list[Path], target: str, name: str) -> str:
    """Build the workspace for `target` (ENTITY/PROJECT), save it as a new view; its URL."""
    from sparrow.train.logs.wandb_run import has_api_key

    entity, _, project = target.partition("/")
    if not entity or not project or "/" in project:
        raise UserError(f"--wandb-workspace {target!r}: expected ENTITY/PROJECT")
    workspace = build_workspace(run_dirs, entity, project, name)
    if not has_api_key():
        raise UserError(
            "saving a W&B workspace needs an API key: run `wandb login` or set WANDB_API_KEY"
        )
    try:
        return workspace.save_as_new_view().url
    except Exception as err:  # network and permission errors come as several wandb types
        raise UserError(f"W&B did not save the workspace for {target} ({err})") from err


def _panel(wr, panel: Panel, keys: list[str]):
    title = panel.name.replace("_", " ")
    if panel.kind == "heatmap":
        return wr.CustomChart(
            query={"summaryTable": {"tableKey": panel.wandb_key}},
            chart_name=HEATMAP_PRESET,
            chart_fields=HEATMAP_FIELDS,
            chart_strings={"title": title},
        )
    if panel.kind == "histogram":
        return wr.LinePlot(title=title, y=[panel.wandb_key])
    series = list(keys)
    if panel.band is not None:
        series += list(panel.band)
    if panel.reference is not None:
        series.append(panel.reference)
    return wr.LinePlot(
        title=title,
        y=series,
        title_y=panel.ylabel,
        plot_type="stacked-area" if panel.kind == "stacked" else None,
        legend_position="south",
    )


def _modules():
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
    except ImportError as err:
        raise UserError(
            "--wandb-workspace needs the wandb-workspaces package: "
            "pip install 'wandb-workspaces>=0.4.13' (or sparrow[dashboards])"
        ) from err
    return ws, wr
