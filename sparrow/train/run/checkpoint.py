"""Training checkpoints on disk: atomic writes, verification, keep-last-N, resume lookup.

Layout of one checkpoint, `root/step_000123/`:
    actor/                 what the actor's save callback wrote (DeepSpeed: weights, optimizer, LR)
    trainer_state.pt       the trainer's state dict (data position, controller, LoRA, metrics, ...)
    trainer_state.json     its JSON-serialisable part, for people
    rng_rank{r}.pt         python / numpy / torch (/ CUDA) RNG states of rank r
    COMPLETE               manifest: every other file's size and checksum (sha256 for small
                           files, CRC-32 for large ones: ~1 GB/s, catches flipped or zeroed bytes)

A checkpoint is written into `step_000123.tmp/`, flushed to disk, marked COMPLETE and only then
renamed: a crash (SIGKILL included) at any point leaves either the old set of checkpoints or the
new complete one, never a half-written `step_*` directory. All ranks call save/load (the actor's
DeepSpeed save is collective); only rank 0 writes shared files, renames and prunes. Ranks must
share the filesystem under `root`.
"""

import errno
import hashlib
import json
import logging
import os
import random
import re
import shutil
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from sparrow.distributed import Ranks

logger = logging.getLogger(__name__)

MARKER = "COMPLETE"
CHECKSUM_MAX_BYTES = 1 << 20  # files up to this size get a sha256, larger ones a CRC-32
_CRC_CHUNK_BYTES = 16 << 20  # read size when checksumming large files
# How torch.save's C++ writer reports a failed write (it carries no errno).
_TORCH_WRITE_FAILED = ("unexpected pos", "file write failed")
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class LoadedCheckpoint:
    path: Path  # the checkpoint directory
    step: int  # trainer step it was saved after
    state: dict[str, Any]  # the trainer state passed to save (plus "step")
    actor_dir: Path  # hand to the actor's load_checkpoint


class CheckpointManager:
    """Writes `root/step_{step:06d}/` atomically and keeps the newest `keep_last` of them."""

    def __init__(self, root: str | Path, keep_last: int):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last
        if _rank() == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            for leftover in self.root.glob("step_*.tmp"):
                logger.warning("removing unfinished checkpoint %s", leftover)
                shutil.rmtree(leftover)
        _barrier()

    def save(
        self,
        step: int,
        state: dict[str, Any],
        save_actor: Callable[[Path], None] | None = None,
    ) -> Path:
        """Write checkpoint `step` (all ranks call); returns its final directory.

        A full disk raises OSError(ENOSPC) naming the checkpoint directory (torch's own writer
        reports it as a bare RuntimeError), after removing the partial copy to free its space.
        """
        tmp = self.root / f"step_{step:06d}.tmp"
        try:
            return self._save(step, state, save_actor, tmp)
        except (OSError, RuntimeError) as err:
            if not _is_disk_full(err):
                raise
            if _rank() == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.root)) from err

    def _save(self, step, state, save_actor, tmp: Path) -> Path:
        final = self.root / f"step_{step:06d}"
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        _barrier()
        if save_actor is not None:
            save_actor(tmp / "actor")
        torch.save(_rng_state(), tmp / f"rng_rank{_rank()}.pt")
        if _rank() == 0:
            torch.save({**state, "step": step}, tmp / "trainer_state.pt")
            (tmp / "trainer_state.json").write_text(json.dumps(_json_part(state, step), indent=1))
        _barrier()
        if _rank() == 0:
            manifest = _manifest(tmp)  # also fsyncs every file, whichever rank wrote it
            _write_durably(tmp / MARKER, json.dumps({"step": step, "files": manifest}, indent=1))
            _fsync_dir(tmp)
            if final.exists():  # re-saving a step (e.g. right after a resume): replace it
                shutil.rmtree(final)
            os.replace(tmp, final)
            _fsync_dir(self.root)
            self._prune()
        _barrier()
        return final

    def latest_complete(self) -> Path | None:
        """Newest checkpoint whose marker and files all check out; warns about each one skipped."""
        for _, path in sorted(self._step_dirs(), reverse=True):
            problem = verify(path)
            if problem is None:
                return path
            logger.warning("skipping checkpoint %s: %s", path, problem)
        return None

    def load(self, path: str | Path, restore_rng: bool = True) -> LoadedCheckpoint:
        """Read the trainer state of checkpoint `path` and (by default) restore this rank's RNG."""
        path = Path(path)
        # Our own files, written by save() above: full unpickling is safe here.
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        rng_file = path / f"rng_rank{_rank()}.pt"
        if restore_rng:
            if rng_file.exists():
                _set_rng_state(torch.load(rng_file, weights_only=False))
            else:
                logger.warning("%s missing (world size changed?): RNG not restored", rng_file)
        return LoadedCheckpoint(
            path=path, step=state["step"], state=state, actor_dir=path / "actor"
        )

    def _step_dirs(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        found = ((_STEP_DIR.match(p.name), p) for p in self.root.iterdir() if p.is_dir())
        return [(int(m.group(1)), p) for m, p in found if m]

    def _prune(self) -> None:
        """Delete every checkpoint older than the newest `keep_last` marked ones."""
        marked = sorted(s for s, p in self._step_dirs() if (p / MARKER).exists())
        if len(marked) <= self.keep_last:
            return
        oldest_kept = marked[-self.keep_last]
        for step, path in self._step_dirs():
            if step < oldest_kept:
                shutil.rmtree(path)


def _is_disk_full(err: BaseException | None) -> bool:
    while err is not None:
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
        if isinstance(err, RuntimeError) and any(s in str(err) for s in _TORCH_WRITE_FAILED):
            return True
        err = err.__cause__ or err.__context__
    return False


def verify(path: Path) -> str | None:
    """What is wrong with checkpoint `path` (naming the file), or None when it is complete."""
    marker = path / MARKER
    if not marker.exists():
        return f"no {MARKER} marker ({marker})"
    try:
        files = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError) as err:
        return f"unreadable marker {marker} ({err})"
    for rel, expected in files.items():
        file = path / rel
        if not file.is_file():
            return f"missing file {file}"
        size = file.stat().st_size
        if size != expected["bytes"]:
            return f"{file} has {size} bytes, expected {expected['bytes']}"
        if "sha256" in expected and _sha256(file) != expected["sha256"]:
            return f"{file} fails its sha256 check"
        if "crc32" in expected and _crc32(file) != expected["crc32"]:
            return f"{file} fails its CRC-32 check"
    return None


def _manifest(directory: Path) -> dict[str, dict[str, Any]]:
    manifest = {}
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        with open(file, "rb") as f:
            os.fsync(f.fileno())
        entry: dict[str, Any] = {"bytes": file.stat().st_size}
        if entry["bytes"] <= CHECKSUM_MAX_BYTES:
            entry["sha256"] = _sha256(file)
        else:
            entry["crc32"] = _crc32(file)
        manifest[str(file.relative_to(directory))] = entry
    for sub in (p for p in directory.rglob("*") if p.is_dir()):
        _fsync_dir(sub)
    return manifest


def _sha256(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def _crc32(file: Path) -> int:
    crc = 0
    with open(file, "rb") as f:
        while chunk := f.read(_CRC_CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
    return crc


def _write_durably(file: Path, text: str) -> None:
    with open(file, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _json_part(state: dict[str, Any], step: int) -> dict[str, Any]:
    """The entries of `state` that JSON can hold as they are (tensors and the like are left out)."""
    out: dict[str, Any] = {"step": step}
    for key, value in state.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        out[key] = value
    return out


def _rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _barrier() -> None:
    Ranks.of_process_group().barrier()
