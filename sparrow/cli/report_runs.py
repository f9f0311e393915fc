"""The run directories a dashboard is drawn from: each run's metrics.jsonl rows and bin width,
the keys they logged and the position bins they decoded (sparrow-report's PNGs and the W&B
workspace read the same)."""

import json
from dataclasses import dataclass
from pathlib import Path

from sparrow.cli.errors import UserError
from sparrow.train.logs.metrics_logger import read_metrics
from sparrow.train.logs.panels import decoded_bins
from sparrow.train.run.stored_config import FILE_NAME as RUN_CONFIG


@dataclass
class RunData:
    name: str  # "" for a single run
    rows: list[dict]
    bin_tokens: int | None  # position-bin width, for labels; None: label by index


def load_runs(run_dirs: list[Path], bin_tokens: int | None = None):
    """(RunData per directory, the union of their keys, the bins any of them decoded);
    `bin_tokens` labels bins of runs that stored no config."""
    runs = [
        RunData(
            d.name if len(run_dirs) > 1 else "", read_metrics(d), stored_bin_tokens(d) or bin_tokens
        )
        for d in run_dirs
    ]
    if not any(run.rows for run in runs):
        where = ", ".join(str(d / "metrics.jsonl") for d in run_dirs)
        raise UserError(f"{where}: no metrics rows (has the run logged a step yet?)")
    keys = {k for run in runs for row in run.rows for k in row}
    per_run = [decoded_bins(run.rows) for run in runs]
    bins = None if all(b is None for b in per_run) else set().union(*(b or set() for b in per_run))
    return runs, keys, bins


def stored_bin_tokens(run_dir: Path) -> int | None:
    """The run's position-bin width, from the config it stored; None when unknown."""
    try:
        return int(json.loads((run_dir / RUN_CONFIG).read_text())["schedule"]["bin_tokens"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
