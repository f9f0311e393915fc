"""`sparrow-report RUN_DIR [RUN_DIR ...]`: the method's dashboard as PNGs from metrics.jsonl, or
as a W&B workspace.

    sparrow-report runs/default                          # RUN_DIR/report/*.png and report.png
    sparrow-report runs/default --wandb-workspace ENTITY/PROJECT

The panels, their sections (tail acceptance, budget, learning, rollout correction, cost) and
their order are sparrow/train/logs/panels.py's, for the PNGs and the workspace alike. One PNG per
panel that has data, and report.png with all of them in their sections. Per-bin series are drawn
only for position bins that decoded tokens, labelled by the positions they cover (from the run's
stored run_config.json: schedule.bin_tokens). Several run directories are overlaid, one line
style per run. `--wandb-workspace` saves the same panels as a W&B workspace of that project
(needs the wandb-workspaces package, an API key and network; see sparrow/cli/wandb_workspace.py).
"""

import math
import sys
from pathlib import Path

from sparrow.cli.errors import ArgumentParser, run_main
from sparrow.cli.report_runs import load_runs
from sparrow.train.logs.panels import layout

OVERVIEW = "report.png"
_COLUMNS = 3  # panels per row in report.png


def render(run_dirs: list[Path], out_dir: Path, bin_tokens: int | None = None) -> list[Path]:
    """Write one PNG per panel with data and the overview; returns their paths, overview last."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sparrow.cli.panel_drawing import Palette, draw

    runs, keys, bins = load_runs(run_dirs, bin_tokens)
    sections = layout(keys, bins)
    palette = Palette(sorted(bins or ()))
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for _, panels in sections:
        for panel, panel_keys in panels:
            fig, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
            if draw(ax, panel, panel_keys, runs, palette):
                written.append(out_dir / f"{panel.name}.png")
                fig.savefig(written[-1], dpi=110)
            plt.close(fig)
    written.append(_overview(sections, runs, palette, out_dir / OVERVIEW, plt))
    return written


def _overview(sections, runs, palette, path: Path, plt) -> Path:
    """All panels on one page, a block of rows per section under the section's name."""
    from sparrow.cli.panel_drawing import draw

    heights = [math.ceil(len(panels) / _COLUMNS) for _, panels in sections]
    fig = plt.figure(figsize=(6 * _COLUMNS, 3.9 * sum(heights)), layout="constrained")
    blocks = fig.subfigures(len(sections), 1, height_ratios=heights)
    for block, (section, panels) in zip(list(_flat(blocks)), sections, strict=True):
        block.suptitle(section, fontsize=13, fontweight="bold", x=0.01, ha="left")
        axes = block.subplots(math.ceil(len(panels) / _COLUMNS), _COLUMNS, squeeze=False).ravel()
        for ax, (panel, keys) in zip(axes, panels, strict=False):
            if not draw(ax, panel, keys, runs, palette):
                ax.set_visible(False)
        for ax in axes[len(panels) :]:
            ax.set_visible(False)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _flat(blocks):
    return blocks.ravel() if hasattr(blocks, "ravel") else [blocks]


def main(argv: list[str] | None = None) -> int:
    return run_main("sparrow-report", lambda: _report(argv))


def _report(argv: list[str] | None) -> int:
    parser = ArgumentParser(prog="sparrow-report", description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (metrics.jsonl)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (RUN_DIR/report)")
    parser.add_argument(
        "--bin-tokens",
        type=int,
        default=None,
        help="position-bin width for the labels of runs without a stored run_config.json",
    )
    parser.add_argument(
        "--wandb-workspace",
        metavar="ENTITY/PROJECT",
        default=None,
        help="save the panels as a W&B workspace of this project instead of drawing PNGs",
    )
    parser.add_argument(
        "--workspace-name", default="sparrow: the method", help="the W&B workspace's name"
    )
    args = parser.parse_args(argv)
    for d in args.run_dirs:
        if not (d / "metrics.jsonl").is_file():
            print(f"sparrow-report: {d}/metrics.jsonl not found", file=sys.stderr)
            return 2
    if args.wandb_workspace is not None:
        from sparrow.cli.wandb_workspace import save_workspace

        print(save_workspace(args.run_dirs, args.wandb_workspace, args.workspace_name))
        return 0
    out = args.out or (args.run_dirs[0] / "report")
    for path in render(args.run_dirs, out, args.bin_tokens):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
