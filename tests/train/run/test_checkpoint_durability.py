"""The checkpoint's durability order, read from the calls it makes rather than from a crash.

A power loss keeps what was fsynced; the COMPLETE marker promises every other file of the
checkpoint. So, in the order the calls happen: every data file (the actor's, nested ones
included, and the trainer's) is fsynced after it was last written and before COMPLETE is opened;
COMPLETE is fsynced; every directory of the checkpoint is fsynced (their entries are data too);
only then is `step_N.tmp` renamed to `step_N`, and the parent directory fsynced after the rename.
A kill test can only show that a torn checkpoint is skipped; this one fails if a file were
fsynced after the marker, or not at all, although no test process ever loses power.
"""

import builtins
import os
from pathlib import Path

import pytest
import torch

from sparrow.train.run import checkpoint
from sparrow.train.run.checkpoint import MARKER, CheckpointManager, verify


def _path_of(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


@pytest.fixture
def calls(monkeypatch):
    """Every fsync (by path), write-mode open and rename, in order, as (op, path[, dest])."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to name a file descriptor's path")
    log = []
    real_fsync, real_open, real_replace = os.fsync, builtins.open, os.replace

    def fsync(fd):
        log.append(("fsync", _path_of(fd)))
        return real_fsync(fd)

    def opened(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            log.append(("open_w", str(Path(file).resolve())))
        return real_open(file, mode, *args, **kwargs)

    def replace(src, dst, *args, **kwargs):
        log.append(("rename", str(Path(src).resolve()), str(Path(dst).resolve())))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(builtins, "open", opened)
    monkeypatch.setattr(os, "replace", replace)
    return log


def _save_actor(directory: Path) -> None:
    """What a DeepSpeed save leaves: nested files, one large (CRC-32 path), none fsynced."""
    (directory / "deepspeed").mkdir(parents=True)
    torch.save(torch.arange(300_000, dtype=torch.float32), directory / "deepspeed" / "model.pt")
    with open(directory / "deepspeed" / "optim.pt", "wb") as f:
        f.write(b"optimizer state" * 100)
    (directory / "latest").write_text("deepspeed")


def test_every_file_is_durable_before_the_marker_and_the_rename(tmp_path, calls):
    root = (tmp_path / "checkpoints").resolve()
    manager = CheckpointManager(root, keep_last=2)
    calls.clear()
    final = manager.save(7, {"prompts": {"epoch": 0}}, _save_actor)

    tmp, final = str(root / "step_000007.tmp"), str(final.resolve())
    assert verify(Path(final)) is None
    files = [p for p in Path(final).rglob("*") if p.is_file() and p.name != MARKER]
    data = sorted(str(p.relative_to(final)) for p in files)
    assert len(data) == 6  # the actor's 3 files, trainer_state.{pt,json}, rng_rank0.pt
    order = {call: i for i, call in reversed(list(enumerate(calls)))}  # first occurrence
    marker_opened = order[("open_w", f"{tmp}/{MARKER}")]
    rename = order[("rename", tmp, final)]

    def last(op: str, path: str) -> int:
        hits = [i for i, c in enumerate(calls) if c[:2] == (op, path)]
        assert hits, f"no {op} of {path}"
        return hits[-1]

    for rel in data:
        synced = last("fsync", f"{tmp}/{rel}")
        assert synced < marker_opened, f"{rel} fsynced after the marker was opened"
        written = [i for i, c in enumerate(calls) if c == ("open_w", f"{tmp}/{rel}")]
        assert all(i < synced for i in written), f"{rel} written again after its fsync"
    assert marker_opened < last("fsync", f"{tmp}/{MARKER}") < rename
    for directory in (tmp, f"{tmp}/actor", f"{tmp}/actor/deepspeed"):
        assert last("fsync", directory) < rename, f"directory {directory} not fsynced in time"
    assert rename < last("fsync", str(root)), "the rename itself is not made durable"


def test_the_order_check_sees_a_file_fsynced_after_the_marker(tmp_path, calls, monkeypatch):
    """Move one file's fsync after the marker: the recorded order must show it."""
    real_manifest = checkpoint._manifest

    def late_manifest(directory):
        manifest = real_manifest(directory)
        calls[:] = [c for c in calls if c != ("fsync", f"{directory.resolve()}/rng_rank0.pt")]
        return manifest

    monkeypatch.setattr(checkpoint, "_manifest", late_manifest)
    with pytest.raises(AssertionError, match="no fsync of .*rng_rank0.pt"):
        test_every_file_is_durable_before_the_marker_and_the_rename(tmp_path, calls)
