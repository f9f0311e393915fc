"""TensorBoard event files beside metrics.jsonl: every numeric metric of a row as a scalar, and
the per-token histograms, so that `tensorboard --logdir runs/` shows a run with no account.

Each row is written as one event (all its scalars in one summary) and flushed, so a killed
process leaves whole rows. History stays exact on resume, as for metrics.jsonl: the writer of a
resumed run starts its file with a SessionLog.START at the first step after the checkpoint (what
SummaryWriter's `purge_step` writes), which tells TensorBoard's readers to drop every event of a
later step from earlier files (those steps are redone), and then re-sends the kept rows the event
files lack (found by reading them back). Scalars are stored as float32 (TensorBoard's
`simple_value`).
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.utils.tensorboard.writer import FileWriter

_EVENT_FILE = re.compile(r"events\.out\.tfevents\.(\d+)\..*\.(\d+)$")


@dataclass
class TensorBoardConfig:
    enabled: bool = False  # also write TensorBoard event files (`tensorboard --logdir runs/`)
    dir: str | None = None  # where; None: RUN_DIR/tensorboard


class TensorBoardLog:
    """One event file per launch in `log_dir`; rank 0 only."""

    def __init__(self, log_dir: Path):
        try:
            from torch.utils.tensorboard.writer import FileWriter
        except ImportError as err:  # torch's writer needs the tensorboard package
            raise ValueError(
                "logger.tensorboard.enabled=true needs the tensorboard package: "
                "pip install 'tensorboard>=2.21' (or sparrow[dashboards])"
            ) from err
        self._file_writer_cls = FileWriter
        self.log_dir = Path(log_dir)
        self._writer: FileWriter | None = None

    def open(self, first_step: int | None = None) -> "FileWriter":
        """Start this launch's event file; `first_step`: steps from here on are (re)written by
        this launch, so readers drop them from earlier files."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self.close()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = self._file_writer_cls(str(self.log_dir), max_queue=100, flush_secs=30)
        if first_step is not None:
            start = SessionLog(status=SessionLog.START)
            self._writer.add_event(Event(step=first_step, session_log=start))
        return self._writer

    def log_row(self, row: dict) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        writer = self.open() if self._writer is None else self._writer
        values = [
            Summary.Value(tag=key, simple_value=value)
            for key, value in ((k, _scalar(v)) for k, v in row.items() if k != "step")
            if value is not None
        ]
        writer.add_summary(Summary(value=values), row["step"])
        writer.flush()

    def log_histogram(self, step: int, name: str, values) -> None:
        import numpy as np
        from torch.utils.tensorboard.summary import histogram

        writer = self.open() if self._writer is None else self._writer
        writer.add_summary(histogram(name, np.asarray(values, dtype=np.float64), "auto"), step)

    def last_row_step(self) -> int:
        """The last step whose row the event files hold as TensorBoard reads them (purges
        applied); -1 when none."""
        from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

        last = -1
        for path in event_files(self.log_dir):
            for event in LegacyEventFileLoader(str(path)).Load():  # as stored
                if event.HasField("session_log") and event.session_log.status == 1:  # START
                    last = min(last, event.step - 1)
                elif event.HasField("summary") and any(
                    v.WhichOneof("value") == "simple_value" for v in event.summary.value
                ):
                    last = max(last, event.step)
        return last

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def event_files(log_dir: Path) -> list[Path]:
    """The event files of `log_dir` in the order they were written (creation second, then the
    writer's per-process counter)."""

    def order(path: Path):
        match = _EVENT_FILE.search(path.name)
        return (int(match.group(1)), int(match.group(2))) if match else (0, 0)

    return sorted(Path(log_dir).glob("events.out.tfevents.*"), key=lambda p: (order(p), p.name))


def _scalar(value) -> float | None:
    """A row value as a TensorBoard scalar: numbers, and the strings metrics.jsonl writes for
    non-finite floats; None for anything else (lists, tables, text)."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    return None
