"""Exact run history on resume: metrics.jsonl cut back to the resumed step.

A killed run may have logged steps after its last checkpoint (they are redone on resume) and may
have left a torn last line. `truncate_metrics` keeps the rows up to the resumed step, drops torn
or glued lines, and rewrites the file atomically, so that after any number of kills every step
appears exactly once. The kept rows are returned: the logger re-sends them to W&B, whose
buffered steps die with a killed process.
"""

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def truncate_metrics(path: Path, last_step: int) -> list[dict]:
    """Keep the rows of `path` with step <= last_step (all of them gone when last_step < 0)."""
    path = Path(path)
    if not path.is_file():
        return []
    kept, dropped, torn = [], 0, 0
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            torn += 1
            continue
        if not isinstance(row, dict) or row.get("step", last_step + 1) > last_step:
            dropped += 1
            continue
        kept.append(row)
    if dropped or torn:
        log.warning(
            "%s: cut back to step %d (%d later rows and %d torn lines removed)",
            path,
            last_step,
            dropped,
            torn,
        )
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
        os.replace(tmp, path)
    return kept
