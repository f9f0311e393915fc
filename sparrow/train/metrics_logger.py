"""Run logging: metrics.jsonl in the run directory, W&B (online, offline or disabled), console.

W&B online without an API key or without network falls back to offline with a warning, so a
run never dies because a dashboard is unreachable; `sparrow-report RUN_DIR` draws the same
metrics from metrics.jsonl for people without W&B.
"""

import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from sparrow.train.run_history import truncate_metrics

log = logging.getLogger(__name__)

WANDB_MODES = ("online", "offline", "disabled")


@dataclass
class WandbConfig:
    mode: str = "offline"  # online | offline | disabled; online falls back to offline
    project: str = "sparrow"  # W&B project name
    entity: str | None = None  # W&B entity (team); None = the key's default
    name: str | None = None  # run name; None = the run directory's name
    init_timeout_s: float = 30.0  # how long wandb.init may try to reach the server

    def __post_init__(self):
        if self.mode not in WANDB_MODES:
            raise ValueError(f"logger.wandb.mode={self.mode!r}: expected one of {WANDB_MODES}")


@dataclass
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)  # W&B settings
    console_every: int = 1  # print one summary line every this many steps

    def __post_init__(self):
        if self.console_every < 1:
            raise ValueError(f"logger.console_every must be >= 1, got {self.console_every}")


class MetricsLogger:
    """Writes each step's scalar metrics to metrics.jsonl and W&B; rank 0 only."""

    def __init__(self, cfg: LoggerConfig, run_dir: Path, config_dict: dict, enabled: bool = True):
        self.cfg = cfg
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._wandb_run = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._wandb_run = _init_wandb(cfg.wandb, Path(run_dir), config_dict)

    def log(self, step: int, metrics: dict) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self._wandb_run is not None:
            self._wandb_run.log(_for_wandb(row), step=step)

    def resume_at(self, step: int) -> None:
        """Cut metrics.jsonl back to `step` (the resumed checkpoint; -1: a fresh start) and
        re-send the kept rows to W&B, which loses what a killed process had buffered."""
        if not self.enabled:
            return
        rows = truncate_metrics(self.path, step)
        if self._wandb_run is None:
            return
        first_new = self._wandb_run.starting_step  # steps W&B already holds for this run id
        for row in rows:
            if row["step"] >= first_new:
                self._wandb_run.log(_for_wandb(row), step=row["step"])

    def log_histogram(self, step: int, name: str, values) -> None:
        """A distribution (e.g. per-token acceptance) as a W&B histogram; jsonl keeps summaries."""
        if self._wandb_run is None or len(values) == 0:
            return
        import wandb

        self._wandb_run.log({name: wandb.Histogram(list(map(float, values)))}, step=step)

    def close(self) -> None:
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None


def read_metrics(run_dir: Path) -> list[dict]:
    """All rows of a run's metrics.jsonl; a torn last line (killed mid-write) is ignored."""
    rows = []
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s: skipping a torn line", path)
    return rows


def _init_wandb(cfg: WandbConfig, run_dir: Path, config_dict: dict):
    if cfg.mode == "disabled":
        return None
    import wandb

    mode = cfg.mode
    if mode == "online" and not (os.environ.get("WANDB_API_KEY") or _has_netrc_key()):
        log.warning("W&B online requested but no API key found: logging offline instead")
        mode = "offline"
    kwargs = dict(
        project=cfg.project,
        entity=cfg.entity,
        name=cfg.name or run_dir.name,
        dir=str(run_dir),
        config=config_dict,
        resume="allow",
        id=_run_id(run_dir),
    )
    try:
        return wandb.init(
            mode=mode, settings=wandb.Settings(init_timeout=cfg.init_timeout_s), **kwargs
        )
    except Exception as err:  # network errors surface as several wandb exception types
        if mode != "online":
            raise
        log.warning(
            "W&B online init failed (%s): logging offline instead", " ".join(str(err).split())
        )
        # The failed attempt keeps the run id registered with the wandb service ("run ID ... is
        # in use"): shut the service down so that the offline run can take the same id.
        wandb.teardown()
        return wandb.init(mode="offline", **kwargs)


def _run_id(run_dir: Path) -> str:
    """A stable id per run directory, so a resumed run appends to the same W&B run."""
    id_file = run_dir / "wandb_run_id"
    if id_file.is_file():
        return id_file.read_text().strip()
    import uuid

    run_id = uuid.uuid4().hex[:12]
    id_file.write_text(run_id)
    return run_id


def _has_netrc_key() -> bool:
    netrc = Path.home() / ".netrc"
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text()


def _for_wandb(row: dict) -> dict:
    """A metrics row as W&B takes it: lists of records (e.g. eval/samples) become tables."""
    out = {}
    for key, value in row.items():
        if key == "step":
            continue
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            import wandb

            columns = list(value[0])
            value = wandb.Table(columns=columns, data=[[v.get(c) for c in columns] for v in value])
        out[key] = value
    return out


def _jsonable(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
