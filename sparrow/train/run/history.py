"""Exact run history: metrics.jsonl rows made durable as they are written, and cut back to the
resumed step on resume, with the checkpoint's own copy of its step's row put back if the file
lost it.

`append_row` flushes and fsyncs each row before returning, and the trainer logs a step's row
before it saves the step's checkpoint: a checkpoint marked COMPLETE never outlives its row in
the file. The checkpoint also carries its row (the trainer's state `metrics_row`), so that a row
the file lost all the same (a torn last line: a disk that dropped the tail on a power cut, a
copy cut short) is restored from there on resume instead of being lost for good; its step is not
redone, since its checkpoint exists.

`truncate_metrics` keeps the rows up to the resumed step, drops torn or glued lines and rows of
steps after the checkpoint (they are redone), restores the checkpoint's row, and rewrites the
file atomically, so that after any number of kills every step appears exactly once. The kept
rows are returned: the logger re-sends them to W&B and TensorBoard, whose buffered steps die
with a killed process.
"""

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class History:
    rows: list[dict]  # the rows kept, in file order (the restored row last)
    restored_step: int | None  # the step whose row came back from its checkpoint, if any


def append_row(path: Path, row: dict) -> None:
    """Append one row to `path` and make it durable (flushed and fsynced) before returning."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def truncate_metrics(path: Path, last_step: int, checkpoint_row: dict | None = None) -> History:
    """Keep the rows of `path` with step <= last_step (none when last_step < 0); put back
    `checkpoint_row` (the resumed checkpoint's copy of its step's row) if the file lacks it."""
    path = Path(path)
    kept, dropped, torn = [], 0, 0
    lines = path.read_text().splitlines() if path.is_file() else []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            torn += 1
            continue
        if not isinstance(row, dict) or row.get("step", last_step + 1) > last_step:
            dropped += 1
            continue
        kept.append(row)
    restored = None
    if checkpoint_row is not None and checkpoint_row.get("step") == last_step >= 0:
        if all(row["step"] != last_step for row in kept):
            kept.append(checkpoint_row)
            restored = last_step
            log.warning(
                "%s: the row of step %d was torn or missing; restored it from the step-%d "
                "checkpoint",
                path,
                last_step,
                last_step,
            )
    if dropped or torn:
        log.warning(
            "%s: cut back to step %d (%d later rows and %d torn lines removed)",
            path,
            last_step,
            dropped,
            torn,
        )
    if dropped or torn or restored is not None:
        _rewrite(path, kept)
    return History(kept, restored)


def _rewrite(path: Path, rows: list[dict]) -> None:
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w") as f:
        f.write("".join(json.dumps(row) + "\n" for row in rows))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
