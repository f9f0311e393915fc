"""Test helper: the steps an offline W&B run dir holds, read from its `.wandb` files.

wandb 0.31 writes each run's records (protobuf `Record`s from wandb.proto) into
`wandb/offline-run-*/run-<id>.wandb` as a LevelDB-style log: a 7-byte header (":W&B", magic
0xBEE1, version 0), then 32 KiB blocks of chunks, each with a 7-byte header (CRC-32C, length,
type: 1 full, 2 first, 3 middle, 4 last). This reads those files with wandb's own protobuf
classes, so a test can check what a later `wandb sync` would upload.
"""

import json
import struct
import time
from pathlib import Path

from hang_guard import HANG_GUARD_S
from wandb.proto import wandb_internal_pb2

_BLOCK = 32 * 1024
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: Path):
    """Every complete record of one .wandb file (a torn tail is ignored)."""
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a .wandb file")
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _HEADER:  # block trailer padding
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 0 and length == 0:  # zero padding at the end of a block
            pos += _BLOCK - pos % _BLOCK if pos % _BLOCK else 0
            continue
        if len(chunk) < length:
            break
        if kind == _FULL:
            pending = b""
            yield _parse(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield _parse(pending + chunk)
            pending = b""


def logged_steps(run_dir: Path) -> dict[int, dict]:
    """{step: {key: value}} over all offline runs under run_dir/wandb (later files win)."""
    steps: dict[int, dict] = {}
    for file in sorted(Path(run_dir, "wandb").glob("offline-run-*/run-*.wandb")):
        for record in records(file):
            if not record.HasField("history"):
                continue
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            if "_step" in items:
                steps[int(items["_step"])] = items
    return steps


def wait_until_written(run_dir: Path) -> None:
    """Wait until every offline run under run_dir/wandb holds its exit record and stops growing:
    wandb's service may still be writing when finish() has returned (seen on the loaded VM)."""
    deadline = time.monotonic() + HANG_GUARD_S
    for file in Path(run_dir, "wandb").glob("offline-run-*/run-*.wandb"):
        size = -1
        while time.monotonic() < deadline:
            done = any(r.HasField("exit") for r in records(file))
            if done and file.stat().st_size == size:
                break
            size = file.stat().st_size
            time.sleep(0.5)


def _parse(payload: bytes):
    record = wandb_internal_pb2.Record()
    record.ParseFromString(payload)
    return record
