"""Whether a run may write into `run_dir`: checked at start-up, before anything is written there.

    check_run_dir(cfg.run_dir, cfg.run_dir_reuse)   # RunDirRefused (one line) or None

A run overwrites or deletes what it finds under the names it writes (`run_config.json` rewritten,
`metrics.jsonl` cut back to the resumed step, `policy/` replaced, old checkpoints removed), so:

- a directory that is not a sparrow run dir and holds any of those names is refused
  (`run_dir_reuse=allow` trains there anyway). A sparrow run dir is one holding sparrow's
  `run.lock` (the first file every run writes, and kept) or a `run_config.json` of sparrow's
  schema; other files beside sparrow's (a README, a console log, data) are never touched and
  refuse nothing. An empty or missing directory is a new run.
- a run dir that is a regular file (or lies under one), or the root of a source checkout (a
  directory holding `.git`, `pyproject.toml` or `setup.py`, e.g. `run_dir=.`), is refused.
- each name the run writes must be of its kind (`policy` a directory, `metrics.jsonl` a file, ...)
  and the run dir and `policy/` writable, so that the export at the end of the run cannot fail
  after the whole run has trained.
"""

import json
import os
from pathlib import Path

from sparrow.train.run.host import FILE_NAME as HOST_FILE
from sparrow.train.run.lock import FILE_NAME as LOCK_FILE
from sparrow.train.run.stored_config import FILE_NAME as CONFIG_FILE

REUSE_MODES = ("refuse", "allow")
# What a run writes at the top of its run dir and would overwrite or delete there
# (run/lock.py, run/stored_config.py, run/host.py, logs/metrics_logger.py, logs/wandb_run.py,
# run/checkpoint.py, run/policy_export.py); W&B's and TensorBoard's folders only gain new files.
WRITTEN_FILES = (LOCK_FILE, CONFIG_FILE, HOST_FILE, "metrics.jsonl", "wandb_run_id")
WRITTEN_DIRS = ("checkpoints", "policy", "policy.tmp")
CHECKOUT_MARKERS = (".git", "pyproject.toml", "setup.py")
# Top-level keys every config sparrow has stored holds (sparrow/train/config.py SparrowConfig).
_CONFIG_KEYS = frozenset({"model", "data", "rl", "actor", "run_dir", "seed", "resume"})
_LOCK_KEYS = frozenset({"host", "pid", "started"})


class RunDirRefused(ValueError):
    """A run dir a run must not write into; str() is one line naming it and what to do."""


def check_run_dir(run_dir: str | Path, reuse: str = "refuse") -> None:
    """Raise RunDirRefused when a run must not write into `run_dir` (see the module docstring);
    `reuse="allow"` lets a run write over files no sparrow run wrote."""
    path = Path(run_dir)
    _check_is_directory(path, run_dir)
    if not path.exists():
        return
    marker = next((m for m in CHECKOUT_MARKERS if (path / m).exists()), None)
    if marker is not None:
        raise RunDirRefused(
            f"run_dir={run_dir} is a source checkout (it holds {marker}): a run would write its "
            "checkpoints and policy among the sources; give the run a directory of its own, "
            "e.g. run_dir=runs/NAME"
        )
    if reuse != "allow" and not is_sparrow_run_dir(path):
        foreign = [n for n in (*WRITTEN_FILES, *WRITTEN_DIRS) if (path / n).exists()]
        if foreign:
            raise RunDirRefused(
                f"run_dir={run_dir} holds {', '.join(foreign)}, which no sparrow run wrote (no "
                f"sparrow {LOCK_FILE} or {CONFIG_FILE} there) and a run would overwrite: choose "
                "another run_dir, or run_dir_reuse=allow to train there anyway"
            )
    _check_kinds(path, run_dir)


def is_sparrow_run_dir(path: Path) -> bool:
    """Whether a sparrow run wrote `path`: its run.lock (empty where the filesystem has no locks,
    else the holder sparrow writes) or its stored config (sparrow's schema) says so."""
    lock = _json(path / LOCK_FILE)
    if lock == "" or (isinstance(lock, dict) and _LOCK_KEYS <= lock.keys()):
        return True
    config = _json(path / CONFIG_FILE)
    return isinstance(config, dict) and _CONFIG_KEYS <= config.keys()


def _check_is_directory(path: Path, run_dir: str | Path) -> None:
    """Refuse a run dir that is, or lies under, something other than a directory."""
    for here in (path, *path.parents):
        if here.is_dir():
            return
        if here.exists() or here.is_symlink():
            where = f"run_dir={run_dir}" + ("" if here == path else f": {here}")
            raise RunDirRefused(
                f"{where} is a file, not a directory: choose a directory (a missing one is created)"
            )


def _check_kinds(path: Path, run_dir: str | Path) -> None:
    """Refuse a name the run writes that is of the other kind, and a run dir or policy/ that
    cannot be written (the export renames policy.tmp/ to policy/ when the run has trained)."""
    for name, want_dir in [
        *((n, False) for n in WRITTEN_FILES),
        *((n, True) for n in WRITTEN_DIRS),
    ]:
        entry = path / name
        if entry.exists() and entry.is_dir() != want_dir:
            kind, other = ("a file", "directory") if want_dir else ("a directory", "file")
            raise RunDirRefused(
                f"{entry} is {kind}, where the run writes its {name} {other}: move it out of "
                f"run_dir={run_dir} or choose another run_dir"
            )
    for entry in (path, path / "policy"):
        if entry.is_dir() and not os.access(entry, os.W_OK | os.X_OK):
            raise RunDirRefused(
                f"cannot write {entry} (permission denied): the run writes its checkpoints and "
                "exports its policy there; make it writable or choose another run_dir"
            )


def _json(path: Path):
    """The JSON value in `path`; "" for an empty file; None when missing or not JSON."""
    try:
        text = path.read_text()
        return json.loads(text) if text.strip() else ""
    except (OSError, ValueError):
        return None
