"""The run's W&B side: init (online falls back to offline), the step axis and run-table summaries
(`define_metric`, by exact name), rows as W&B takes them, and the heat map's table.

W&B online without an API key or without network falls back to offline with a warning, so a run
never dies because a dashboard is unreachable. `step` is declared the x axis of every metric,
and the figures runs are compared by get a summary in the run table: the lowest p5 of each
position bin (and overall), the last KV-read ratio and held-out accuracy. The p5 heat map (bin x
step, the panel `p5_heatmap` of sparrow/train/logs/panels.py) reads a table of every step's
per-bin p5 from the run summary, re-logged every `heatmap_every` steps and at the end.
"""

import fnmatch
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

from sparrow.train.logs.panels import PANELS, bin_index, matches

log = logging.getLogger(__name__)

WANDB_MODES = ("online", "offline", "disabled")
WandbMode = Literal["online", "offline", "disabled"]
STEP_KEY = "step"
# glob -> summary shown in the run table ("min": the worst step is what a user compares).
SUMMARIES = {
    "accept/p5/bin*": "min",
    "accept/p5_min": "min",
    "accept_topk/p5_min": "min",
    "noise_floor/p5_min": "min",
    "kv_read_ratio": "last",
    "speedup/predicted": "last",
    "eval/accuracy": "last",
}
_HEATMAP = next(p for p in PANELS if p.kind == "heatmap")


@dataclass
class WandbConfig:
    mode: str = "offline"  # online | offline | disabled; online falls back to offline
    project: str = "sparrow"  # W&B project name
    entity: str | None = None  # W&B entity (team); None = the key's default
    name: str | None = None  # run name; None = the run directory's name
    init_timeout_s: float = 30.0  # how long wandb.init may try to reach the server
    heatmap_every: int = 10  # re-log the p5 heat map's table every this many steps (and at end)

    def __post_init__(self):
        if self.mode not in WANDB_MODES:
            raise ValueError(f"logger.wandb.mode={self.mode!r}: expected one of {WANDB_MODES}")
        if self.heatmap_every < 1:
            raise ValueError(f"logger.wandb.heatmap_every must be >= 1, got {self.heatmap_every}")


class WandbRun:
    """One W&B run per run directory (its id kept in RUN_DIR/wandb_run_id); rank 0 only."""

    def __init__(self, cfg: WandbConfig, run_dir: Path, config_dict: dict):
        self.cfg = cfg
        self.run = _init(cfg, run_dir, config_dict)
        self._heatmap: dict[int, list[tuple[int, float]]] = {}  # step -> [(bin, p5)]
        self._defined = {STEP_KEY}
        self.run.define_metric(STEP_KEY, hidden=True)

    def _define(self, keys) -> None:
        """Declare each new key by its exact name: the step axis and its run-table summary.

        Not with globs: when a key matches two globs (a summary's and a catch-all "*"), wandb's
        service picks either from one run to the next (seen: the p5 summary "min" in one run,
        the last value in another), and an exact name always wins over a glob.
        """
        for key in keys:
            if key in self._defined:
                continue
            summary = next((s for g, s in SUMMARIES.items() if fnmatch.fnmatchcase(key, g)), None)
            if summary is None:
                self.run.define_metric(key, step_metric=STEP_KEY)
            else:
                self.run.define_metric(key, step_metric=STEP_KEY, summary=summary)
            self._defined.add(key)

    @property
    def first_missing_step(self) -> int:
        """Steps below this one are already held by W&B for this run id (0 offline)."""
        return self.run.starting_step

    def log(self, row: dict) -> None:
        self.remember(row)
        payload = _payload(row)
        self._define(payload)
        self.run.log(payload, step=row[STEP_KEY])
        if row[STEP_KEY] % self.cfg.heatmap_every == 0:
            self.log_heatmap(row[STEP_KEY])

    def remember(self, row: dict) -> None:
        """Keep the row's per-bin p5 for the heat map (rows W&B already holds too)."""
        cells = [
            (b, float(v))
            for k, v in row.items()
            if any(matches(p, k) for p in _HEATMAP.keys)
            and isinstance(v, (int, float))
            and (b := bin_index(k)) is not None
        ]
        if cells:
            self._heatmap[row[STEP_KEY]] = sorted(cells)

    def log_heatmap(self, step: int) -> None:
        if not self._heatmap:
            return
        import wandb

        data = [[s, b, p5] for s in sorted(self._heatmap) for b, p5 in self._heatmap[s]]
        table = wandb.Table(columns=["step", "bin", "p5"], data=data)
        self._define([_HEATMAP.wandb_key])
        self.run.log({_HEATMAP.wandb_key: table}, step=step)

    def log_histogram(self, step: int, name: str, values) -> None:
        import wandb

        self._define([name])
        self.run.log({name: wandb.Histogram(list(map(float, values)))}, step=step)

    def finish(self, last_step: int | None) -> None:
        if last_step is not None and last_step % self.cfg.heatmap_every:
            self.log_heatmap(last_step)
        self.run.finish()


def _init(cfg: WandbConfig, run_dir: Path, config_dict: dict):
    import wandb

    mode = cast(WandbMode, cfg.mode)  # one of WANDB_MODES, checked by WandbConfig
    if mode == "online" and not has_api_key():
        log.warning("W&B online requested but no API key found: logging offline instead")
        mode = "offline"
    kwargs: dict[str, Any] = dict(
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


def has_api_key() -> bool:
    """A W&B API key in the environment or in ~/.netrc (what `wandb login` writes)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path.home() / ".netrc"
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text()


def _payload(row: dict) -> dict:
    """A metrics row as W&B takes it: lists of records (e.g. eval/samples) become tables."""
    out = {}
    for key, value in row.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            import wandb

            columns = list(value[0])
            value = wandb.Table(columns=columns, data=[[v.get(c) for c in columns] for v in value])
        out[key] = value
    return out
