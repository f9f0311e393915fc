"""`sparrow-report RUN_DIR [RUN_DIR ...]`: the W&B dashboard as PNG plots, from metrics.jsonl.

One figure per panel (reward, held-out accuracy, p5/p1/mean acceptance per position bin with the
tau line, budget per bin, KV-read ratio, predicted vs measured speedup, time split); several run
directories are overlaid, one colour per run. Per-bin series are labelled by the positions the
bin covers (from the run's stored run_config.json: schedule.bin_tokens), e.g. `p5 pos 0-2047`.

    sparrow-report runs/default --out runs/default/report
"""

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from sparrow.cli.errors import run_main
from sparrow.train.metrics_logger import read_metrics
from sparrow.train.run_config import FILE_NAME as RUN_CONFIG


@dataclass(frozen=True)
class Panel:
    name: str  # file stem and title
    pattern: str  # regex over metric keys; every matching key is one line per run
    ylabel: str
    hline_key: str | None = None  # a metric drawn as a dashed horizontal line (e.g. tau)


PANELS = (
    Panel("reward", r"^reward/mean$|^acc/train$", "mean reward / train accuracy"),
    Panel("eval_accuracy", r"^eval/accuracy$", "held-out accuracy"),
    Panel("response_length", r"^len/completion_mean$|^eval/len_mean$", "tokens"),
    Panel("p5_acceptance", r"^accept/p5/bin\d+$", "p5 acceptance per bin", "controller/tau"),
    Panel("p1_acceptance", r"^accept/p1/bin\d+$", "p1 acceptance per bin", "controller/tau"),
    Panel("mean_acceptance", r"^accept/mean/bin\d+$", "mean acceptance per bin"),
    Panel("noise_floor", r"^noise_floor/p5/bin\d+$", "dense-vs-dense p5 per bin", "controller/tau"),
    Panel("budget", r"^schedule/budget_pages/bin\d+$", "budget (pages)"),
    Panel("kv_read_ratio", r"^kv_read_ratio$", "pages read / dense pages"),
    Panel("speedup", r"^speedup/(predicted|measured)$", "rollout speedup vs dense"),
    Panel("time_split", r"^time/\w+_s$", "seconds per step"),
    Panel("loss", r"^loss/\w+$", "loss"),
    Panel("correction", r"^correction/(truncated|masked)_frac$", "share of tokens"),
    Panel("entropy", r"^entropy/mean$", "entropy (nats)"),
)


def render(run_dirs: list[Path], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {d.name if len(run_dirs) > 1 else "": read_metrics(d) for d in run_dirs}
    bin_tokens = {d.name if len(run_dirs) > 1 else "": _bin_tokens(d) for d in run_dirs}
    if not any(runs.values()):
        raise SystemExit(f"sparrow-report: no metrics.jsonl rows in {[str(d) for d in run_dirs]}")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for panel in PANELS:
        fig, ax = plt.subplots(figsize=(7, 4))
        drawn = 0
        for run_name, rows in runs.items():
            keys = sorted({k for r in rows for k in r if re.search(panel.pattern, k)}, key=_natural)
            for key in keys:
                xs = [r["step"] for r in rows if isinstance(r.get(key), (int, float))]
                ys = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
                if xs:
                    label = f"{run_name} {_series_label(key, bin_tokens[run_name])}".strip()
                    ax.plot(xs, ys, marker="." if len(xs) < 30 else None, label=label)
                    drawn += 1
            if panel.hline_key:
                taus = [r[panel.hline_key] for r in rows if panel.hline_key in r]
                if taus:
                    ax.axhline(taus[-1], color="k", linestyle="--", linewidth=1, label="tau")
        if drawn == 0:
            plt.close(fig)
            continue
        ax.set_xlabel("step")
        ax.set_ylabel(panel.ylabel)
        ax.set_title(panel.name.replace("_", " "))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2 if drawn > 8 else 1)
        fig.tight_layout()
        path = out_dir / f"{panel.name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    hist = _histogram(runs, out_dir, plt)
    return written + ([hist] if hist else [])


def _histogram(runs: dict, out_dir: Path, plt) -> Path | None:
    """Per-token acceptance histogram (`accept/hist20`: 20 bins over [0, 1]) of each run's
    first and last logged step, as fractions of tokens on a log axis (the tail is what matters)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    drawn = 0
    for run_name, rows in runs.items():
        logged = [r for r in rows if isinstance(r.get("accept/hist20"), list)]
        for row in logged[:1] + logged[-1:] if len(logged) > 1 else logged:
            counts = row["accept/hist20"]
            total = max(sum(counts), 1)
            edges = [i / len(counts) for i in range(len(counts) + 1)]
            label = f"{run_name} step {row['step']}".strip()
            ax.stairs([c / total for c in counts], edges, label=label)
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_yscale("log")
    ax.set_xlabel("per-token acceptance")
    ax.set_ylabel("fraction of tokens")
    ax.set_title("acceptance histogram")
    ax.legend(fontsize=6)
    fig.tight_layout()
    path = out_dir / "acceptance_histogram.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _bin_tokens(run_dir: Path) -> int | None:
    """The run's position-bin width, from the config it stored; None when unknown."""
    try:
        return int(json.loads((run_dir / RUN_CONFIG).read_text())["schedule"]["bin_tokens"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _series_label(key: str, bin_tokens: int | None) -> str:
    """`accept/p5/bin1` -> `accept/p5 pos 2048-4095` (with 2048-token bins)."""
    match = re.fullmatch(r"(.*)/bin(\d+)", key)
    if match is None or bin_tokens is None:
        return key
    i = int(match.group(2))
    return f"{match.group(1)} pos {i * bin_tokens}-{(i + 1) * bin_tokens - 1}"


def _natural(key: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key)]


def main(argv: list[str] | None = None) -> int:
    return run_main("sparrow-report", lambda: _report(argv))


def _report(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="sparrow-report", description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (metrics.jsonl)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (RUN_DIR/report)")
    args = parser.parse_args(argv)
    for d in args.run_dirs:
        if not (d / "metrics.jsonl").is_file():
            print(f"sparrow-report: {d}/metrics.jsonl not found", file=sys.stderr)
            return 2
    out = args.out or (args.run_dirs[0] / "report")
    for path in render(args.run_dirs, out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
