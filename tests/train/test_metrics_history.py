"""History that cannot lose a step: a step's metrics row is durable before its checkpoint is
marked complete, and a row the file lost all the same comes back from the checkpoint.

The whole GRPO loop in-process with the plain-torch FakeActor (seconds). Before the fix, a torn
last row whose checkpoint existed was dropped for good (its step is not redone): the history read
steps [1, 2, 4], W&B never got step 3 back, and the warning only said "1 torn lines removed".
"""

import importlib.util
import json
import logging
import os
import shutil
from pathlib import Path

from test_loop_fake_actor import _trainer

from sparrow.train.run import checkpoint
from sparrow.train.run.history import truncate_metrics

WANDB_FILES = Path(__file__).resolve().parent / "wandb_files.py"


def _wandb_steps(run_dir: Path) -> dict[int, dict]:
    """What the run's offline W&B files hold, read with wandb's own protobuf classes."""
    spec = importlib.util.spec_from_file_location("wandb_files", WANDB_FILES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.wait_until_written(run_dir)
    return module.logged_steps(run_dir)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_torn_row_is_restored_from_its_checkpoint_and_resent(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    common = ["rl.save_every=1", "logger=offline"]
    _trainer(tmp_path, "rl.steps=3", *common).fit()
    before = _rows(tmp_path)
    assert [r["step"] for r in before] == [1, 2, 3]
    # The last row torn (the disk kept half of it) while its checkpoint is complete; W&B lost
    # what its service had buffered, as with a killed process.
    text = (tmp_path / "metrics.jsonl").read_text()
    last = text.rstrip("\n").rfind("\n") + 1
    (tmp_path / "metrics.jsonl").write_text(text[: last + (len(text) - last) // 2])
    for run in (tmp_path / "wandb").glob("offline-run-*"):
        shutil.rmtree(run)

    with caplog.at_level(logging.WARNING):
        _trainer(tmp_path, "rl.steps=4", *common).fit()
    after = _rows(tmp_path)
    print("steps after the resume:", [r["step"] for r in after])
    assert [r["step"] for r in after] == [1, 2, 3, 4]
    assert after[:3] == before  # step 3's row as it was logged, not redone
    assert "the row of step 3 was torn or missing; restored it from the step-3 checkpoint" in (
        caplog.text
    )
    wandb_steps = _wandb_steps(tmp_path)
    assert sorted(wandb_steps) == [1, 2, 3, 4]
    assert wandb_steps[3]["loss/loss"] == before[2]["loss/loss"]
    assert wandb_steps[3]["reward/mean"] == before[2]["reward/mean"]


def test_row_is_durable_before_its_checkpoint_is_marked_complete(tmp_path, monkeypatch):
    """The order of the durable writes, recorded: each step's metrics.jsonl fsync (with the
    step's row in the file) comes before the COMPLETE marker of that step's checkpoint."""
    events = []
    real_fsync, real_write = os.fsync, checkpoint._write_durably

    def fsync(fd):
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if path.name == "metrics.jsonl":
            events.append(("row durable", _rows(path.parent)[-1]["step"]))
        return real_fsync(fd)

    def write_durably(file: Path, text: str):
        if file.name == checkpoint.MARKER:
            events.append(("checkpoint complete", json.loads(text)["step"]))
        return real_write(file, text)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(checkpoint, "_write_durably", write_durably)
    _trainer(tmp_path, "rl.steps=2", "rl.save_every=1").fit()
    print(events)
    for step in (1, 2):
        complete = events.index(("checkpoint complete", step))
        assert ("row durable", step) in events[:complete], events


def test_cleanly_lost_row_is_restored_into_the_file(tmp_path, caplog):
    """The torn case above with the last row lost whole (the file ends at a line boundary, as
    after a copy cut short between rows): nothing is cut back, yet the checkpoint's row must be
    written back to metrics.jsonl, not only handed to the logger."""
    common = ["rl.save_every=1"]
    _trainer(tmp_path, "rl.steps=2", *common).fit()
    before = _rows(tmp_path)
    assert [r["step"] for r in before] == [1, 2]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "metrics.jsonl").write_text("".join(lines[:-1]))

    with caplog.at_level(logging.WARNING):
        _trainer(tmp_path, "rl.steps=3", *common).fit()
    after = _rows(tmp_path)
    assert [r["step"] for r in after] == [1, 2, 3]
    assert after[:2] == before  # step 2's row as it was logged, not redone
    assert "the row of step 2 was torn or missing; restored it from the step-2 checkpoint" in (
        caplog.text
    )


def test_truncate_writes_back_a_cleanly_lost_row(tmp_path):
    """run_history alone: the file re-read after the cut holds the checkpoint's row."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in (1, 2)))
    lost = {"step": 3, "loss": 0.3}
    history = truncate_metrics(path, 3, checkpoint_row=lost)
    assert history.restored_step == 3
    assert (
        _rows(tmp_path)
        == history.rows
        == [{"step": 1, "loss": 0.1}, {"step": 2, "loss": 0.2}, lost]
    )
