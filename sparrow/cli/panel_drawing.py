"""Matplotlib drawing of one dashboard panel (sparrow/train/logs/panels.py) on one axes, for
sparrow-report.

Read at a glance: one colour per position bin (the same bin has the same colour in every panel),
only bins that decoded tokens, tau as a dashed black line, legends below the axes, never over the
data. Several runs overlaid differ by line style (solid, dashed, dotted, dash-dot).
"""

import re

import matplotlib.colors as mcolors
import numpy as np

from sparrow.cli.report_runs import RunData
from sparrow.train.logs.panels import Panel, bin_index, matches

RUN_STYLES = ("-", "--", ":", "-.")


class Palette:
    """One colour per position bin, and per non-bin key within a panel."""

    def __init__(self, bins: list[int]):
        cmap = "tab10" if len(bins) <= 10 else "tab20" if len(bins) <= 20 else "viridis"
        colours = [mcolors.to_hex(c) for c in _sample(cmap, len(bins))[: len(bins)]]
        self.by_bin = dict(zip(sorted(bins), colours, strict=True))

    def colour(self, key: str, key_index: int) -> str:
        b = bin_index(key)
        if b is not None and b in self.by_bin:
            return self.by_bin[b]
        return mcolors.to_hex(_sample("tab10", 10)[key_index % 10])


def draw(ax, panel: Panel, keys: list[str], runs: list[RunData], palette: Palette) -> bool:
    """Draw `panel` with its resolved `keys`; False when no run had data for it."""
    drawn = {"line": _lines, "stacked": _stacked, "heatmap": _heatmap, "histogram": _histogram}[
        panel.kind
    ](ax, panel, keys, runs, palette)
    if not drawn:
        return False
    ax.set_title(panel.name.replace("_", " "), fontsize=10)
    ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ncol = min(4, len(handles))
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol, fontsize=6.5)
    return True


def _lines(ax, panel, keys, runs, palette) -> bool:
    drawn = 0
    non_bin = [k for k in keys if bin_index(k) is None]
    for r, run in enumerate(runs):
        for key in keys:
            xs, ys = _series(run.rows, key)
            if not xs:
                continue
            faint = panel.faint is not None and matches(panel.faint, key)
            ax.plot(
                xs,
                ys,
                color=palette.colour(key, non_bin.index(key) if key in non_bin else 0),
                linestyle=(0, (2, 2)) if faint and len(runs) == 1 else RUN_STYLES[r % 4],
                linewidth=0.9 if faint else 1.6,
                alpha=0.7 if faint else 1.0,
                marker="." if len(xs) < 30 and not faint else None,
                label=_label(run, key),
            )
            drawn += 1
        if panel.band is not None:
            lo, hi = panel.band
            rows = [row for row in run.rows if _number(row.get(lo)) and _number(row.get(hi))]
            if rows:
                steps = [row["step"] for row in rows]
                ax.fill_between(
                    steps, [row[lo] for row in rows], [row[hi] for row in rows], alpha=0.2
                )
        if panel.reference is not None and r == 0:
            values = [row[panel.reference] for row in run.rows if _number(row.get(panel.reference))]
            if values and drawn:
                ax.axhline(
                    values[-1], color="k", linestyle="--", linewidth=1, label=f"tau {values[-1]:g}"
                )
    ax.set_xlabel("step", fontsize=8)
    return drawn > 0


def _stacked(ax, panel, keys, runs, palette) -> bool:
    """Areas stacked per step, for the first run (several runs' stacks do not overlay)."""
    run = runs[0]
    rows = [row for row in run.rows if all(_number(row.get(k)) for k in keys)]
    if not rows:
        return False
    steps = [row["step"] for row in rows]
    colours = [palette.colour(k, i) for i, k in enumerate(keys)]
    labels = [_label(run, k) for k in keys]
    ax.stackplot(steps, [[row[k] for row in rows] for k in keys], labels=labels, colors=colours)
    ax.set_xlabel("step" + (f" ({run.name})" if run.name else ""), fontsize=8)
    return True


def _heatmap(ax, panel, keys, runs, palette) -> bool:
    """Bins (rows) x steps (columns) of the first run, red below tau and green above."""
    run = runs[0]
    rows = [row for row in run.rows if any(_number(row.get(k)) for k in keys)]
    if not rows:
        return False
    keys = sorted(keys, key=lambda k: bin_index(k) or 0)  # heatmap keys each name their bin
    grid = np.array([[row.get(k, np.nan) for row in rows] for k in keys], dtype=float)
    taus = [row[panel.reference] for row in run.rows if _number(row.get(panel.reference or ""))]
    tau = taus[-1] if taus else 0.86
    lo, hi = min(np.nanmin(grid), tau - 1e-3), max(np.nanmax(grid), tau + 1e-3)
    image = ax.imshow(
        grid,
        aspect="auto",
        interpolation="nearest",
        cmap="RdYlGn",
        norm=mcolors.TwoSlopeNorm(vmin=lo, vcenter=tau, vmax=hi),
        extent=(rows[0]["step"] - 0.5, rows[-1]["step"] + 0.5, len(keys) - 0.5, -0.5),
    )
    ax.set_yticks(range(len(keys)), [_position(run, k) for k in keys], fontsize=6)
    ax.set_xlabel("step" + (f" ({run.name})" if run.name else ""), fontsize=8)
    colorbar = ax.figure.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
    colorbar.set_label(f"p5 (yellow at tau {tau:g})", fontsize=7)
    colorbar.ax.tick_params(labelsize=6)
    return True


def _histogram(ax, panel, keys, runs, palette) -> bool:
    """Per-token acceptance in 20 bins over [0, 1] at each run's first and last logged step, as
    fractions of tokens on a log axis (the tail is what matters)."""
    (key,) = keys
    drawn = 0
    for r, run in enumerate(runs):
        logged = [row for row in run.rows if isinstance(row.get(key), list)]
        for i, row in enumerate(logged[:1] + logged[-1:] if len(logged) > 1 else logged):
            counts = row[key]
            edges = np.linspace(0.0, 1.0, len(counts) + 1)
            label = f"{run.name} step {row['step']}".strip()
            fractions = np.asarray(counts, dtype=float) / max(sum(counts), 1)
            colour = mcolors.to_hex(_sample("tab10", 10)[i])
            ax.stairs(fractions, edges, label=label, color=colour, linestyle=RUN_STYLES[r % 4])
            drawn += 1
    ax.set_yscale("log")
    ax.set_xlabel("per-token acceptance", fontsize=8)
    return drawn > 0


def _series(rows: list[dict], key: str) -> tuple[list, list]:
    points = [(row["step"], row[key]) for row in rows if _number(row.get(key))]
    return [p[0] for p in points], [p[1] for p in points]


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _label(run: RunData, key: str) -> str:
    match = re.fullmatch(r"(.*)/bin\d+", key)
    text = f"{match.group(1)} {_position(run, key)}" if match else key
    return f"{run.name} {text}".strip()


def _position(run: RunData, key: str) -> str:
    """`accept/p5/bin1` -> `pos 2048-4095` (with 2048-token bins), else `bin 1`."""
    i = bin_index(key)
    if i is None or run.bin_tokens is None:
        return f"bin {i}"
    return f"pos {i * run.bin_tokens}-{(i + 1) * run.bin_tokens - 1}"


def _sample(cmap: str, n: int) -> list:
    import matplotlib

    colormap = matplotlib.colormaps[cmap]
    if cmap.startswith("tab"):
        return [colormap(i) for i in range(max(n, 1))]
    return [colormap(x) for x in np.linspace(0.0, 0.9, max(n, 1))]
