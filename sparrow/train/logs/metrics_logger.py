"""Run logging: metrics.jsonl in the run directory, W&B (online, offline or disabled) and
TensorBoard (optional), with one history on resume.

metrics.jsonl is the record: each row is durable (fsynced) when `log` returns, and the trainer
saves a step's checkpoint after logging its row, with a copy of the row in it. On resume the
file is cut back to the checkpoint's step (a torn row restored from the checkpoint, see
run_history.py), and W&B and TensorBoard get back the kept rows they lack, so every sink holds
each step once. `sparrow-report RUN_DIR` draws the same metrics from metrics.jsonl for people
without W&B (sparrow/train/logs/panels.py lists the views).
"""

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from sparrow.train.logs.tensorboard import TensorBoardConfig, TensorBoardLog
from sparrow.train.logs.wandb_run import WandbConfig, WandbRun
from sparrow.train.run.history import append_row, truncate_metrics

log = logging.getLogger(__name__)

__all__ = ["LoggerConfig", "MetricsLogger", "TensorBoardConfig", "WandbConfig", "read_metrics"]


@dataclass
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)  # W&B settings
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)  # TensorBoard
    console_every: int = 1  # print one summary line every this many steps

    def __post_init__(self):
        if self.console_every < 1:
            raise ValueError(f"logger.console_every must be >= 1, got {self.console_every}")


class MetricsLogger:
    """Writes each step's metrics to metrics.jsonl, W&B and TensorBoard; rank 0 only."""

    def __init__(self, cfg: LoggerConfig, run_dir: Path, config_dict: dict, enabled: bool = True):
        self.cfg = cfg
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self.last_row: dict | None = None  # the last row logged (a checkpoint keeps a copy)
        self._wandb: WandbRun | None = None
        self._tensorboard: TensorBoardLog | None = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if cfg.tensorboard.enabled:
            self._tensorboard = TensorBoardLog(Path(cfg.tensorboard.dir or run_dir / "tensorboard"))
        if cfg.wandb.mode != "disabled":
            self._wandb = WandbRun(cfg.wandb, Path(run_dir), config_dict)

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        append_row(self.path, row)
        self.last_row = row
        if self._wandb is not None:
            self._wandb.log(row)
        if self._tensorboard is not None:
            self._tensorboard.log_row(row)

    def resume_at(self, step: int, checkpoint_row: dict | None = None) -> None:
        """Cut metrics.jsonl back to `step` (the resumed checkpoint; -1: a fresh start),
        restoring `checkpoint_row` (the checkpoint's copy of its row) if the file lost it, and
        re-send the kept rows that W&B and TensorBoard lack (a killed process loses what they
        had buffered)."""
        if not self.enabled:
            return
        history = truncate_metrics(self.path, step, checkpoint_row)
        self.last_row = history.rows[-1] if history.rows else None
        if self._wandb is not None:
            first_missing = self._wandb.first_missing_step
            for row in history.rows:
                if row["step"] >= first_missing:
                    self._wandb.log(row)
                else:
                    self._wandb.remember(row)
        if self._tensorboard is not None:
            held = min(self._tensorboard.last_row_step(), step)
            self._tensorboard.open(first_step=step + 1)
            for row in history.rows:
                if row["step"] > held:
                    self._tensorboard.log_row(row)

    def log_histogram(self, step: int, name: str, values) -> None:
        """A distribution (e.g. per-token acceptance) as a W&B and TensorBoard histogram;
        metrics.jsonl keeps summaries."""
        if len(values) == 0:
            return
        if self._wandb is not None:
            self._wandb.log_histogram(step, name, values)
        if self._tensorboard is not None:
            self._tensorboard.log_histogram(step, name, values)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish(None if self.last_row is None else self.last_row["step"])
            self._wandb = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None


def read_metrics(run_dir: Path) -> list[dict]:
    """All rows of a run's metrics.jsonl; a torn last line (killed mid-write) is ignored."""
    rows: list[dict] = []
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s: skipping a torn line", path)
    return rows


def _jsonable(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
