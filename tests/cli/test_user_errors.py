"""Every user or environment error of a console script is one line and exit code 2.

In process (a config load, at most a failed model load each): out-of-range values and enums
(`controller.tau=1.5`, `actor.micro_batch_size=0`, `resume=atuo`, a KV pool of 0 or 1 page),
an ignored `hydra.run.dir`, a model that is not there offline or a missing model folder, a full
disk as torch's own writer reports it (/dev/full), and the boundary's split between user errors
(one line) and bugs (traceback). In a real process (slow): a run dir on a read-only filesystem
and on a full 1 MiB tmpfs (each mounted in a private mount namespace with `unshare`), and
`sparrow-bench --help`.
"""

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hang_guard import HANG_GUARD_S

from sparrow.cli.train import main
from sparrow.train.run.checkpoint import CheckpointManager

ROOT = Path(__file__).resolve().parents[2]
TINY = ["preset=tiny", "rl.steps=1", "rl.eval.every=0"]
_DIST = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
ENV = {k: v for k, v in os.environ.items() if k not in _DIST}
ENV |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _one_line(text: str, prog: str = "sparrow-train") -> str:
    assert "Traceback" not in text, text
    lines = [line for line in text.strip().splitlines() if line.startswith(f"{prog}:")]
    assert len(lines) == 1 and text.rstrip().endswith(lines[0]), text
    return lines[0]


@pytest.mark.parametrize(
    "override, expected",
    [
        ("controller.tau=1.5", "config error: controller.tau must be in (0, 1], got 1.5"),
        ("controller.tau=0", "config error: controller.tau must be in (0, 1], got 0"),
        ("actor.micro_batch_size=0", "config error: actor.micro_batch_size must be >= 1"),
        ("resume=atuo", "config error: resume='atuo': expected auto, never or an existing"),
        ("resume_mismatch=yes", "config error: resume_mismatch='yes': expected refuse or allow"),
        ("rollout.engine.num_pages=0", "config error: rollout.engine.num_pages and page_size"),
        ("rollout.engine.num_pages=1", "config error: rollout.engine.num_pages=1 holds 16 tokens"),
        ("hydra.run.dir=/tmp/elsewhere", "config error: hydra.run.dir is not used by sparrow"),
    ],
)
def test_bad_value_is_one_line_at_config_load(capsys, tmp_path, override, expected):
    assert main([*TINY, f"run_dir={tmp_path}", override]) == 2
    assert expected in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("name", ["nonexistent-org/no-such-model", "{tmp}/no/such/folder"])
def test_model_that_is_not_there_is_one_line_naming_the_key(capsys, tmp_path, name):
    name = name.format(tmp=tmp_path)
    assert main([*TINY, f"run_dir={tmp_path / 'run'}", f"model.name={name}"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"error: cannot load model.name='{name}'" in line
    assert "give a local model directory or a hub id present in the HF cache" in line


def test_full_disk_during_a_checkpoint_says_so(tmp_path):
    from sparrow.cli.errors import user_error_line

    # /dev/full fails every write with ENOSPC: torch's writer reports it without an errno.
    def save_actor(directory: Path) -> None:
        torch.save(torch.zeros(1 << 16), "/dev/full")

    manager = CheckpointManager(tmp_path / "checkpoints", keep_last=2)
    with pytest.raises(OSError) as caught:
        manager.save(1, {"x": 1}, save_actor)
    assert caught.value.errno == errno.ENOSPC
    assert not list((tmp_path / "checkpoints").iterdir())  # the partial copy is removed
    line = user_error_line(caught.value)
    assert line.startswith(f"no space left on the device of {tmp_path / 'checkpoints'}")


def test_boundary_keeps_the_traceback_of_a_bug(capsys):
    from sparrow.cli.errors import run_main

    def bug() -> int:
        raise KeyError("an internal mistake")

    with pytest.raises(KeyError):
        run_main("sparrow-x", bug)

    def missing() -> int:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/nope/model")

    assert run_main("sparrow-x", missing) == 2
    assert _one_line(capsys.readouterr().err, "sparrow-x") == (
        "sparrow-x: error: /nope/model: no such file or directory"
    )


def _in_private_mount(tmp_path: Path, mount_opts: str, cmd: list[str]):
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=HANG_GUARD_S)
    if probe.returncode != 0:
        pytest.skip("unprivileged mount namespaces are not available")
    script = f'mount -t tmpfs -o {mount_opts} tmpfs "{mnt}" && exec "$@"'
    return mnt, subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", *cmd],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


@pytest.mark.slow
def test_read_only_run_dir_is_one_line(tmp_path):
    cmd = [sys.executable, "-m", "sparrow.cli.train", *TINY, f"run_dir={tmp_path}/mnt/run"]
    mnt, proc = _in_private_mount(tmp_path, "ro,size=1m", cmd)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _one_line(proc.stderr)
    assert f"cannot write or read {mnt}/run" in line and "choose a writable run_dir" in line


@pytest.mark.slow
def test_full_disk_is_one_line_saying_so(tmp_path):
    cmd = [sys.executable, "-m", "sparrow.cli.train", *TINY, f"run_dir={tmp_path}/mnt/run"]
    mnt, proc = _in_private_mount(tmp_path, "size=1m", cmd)  # a checkpoint is ~2 MB
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = _one_line(proc.stderr)
    assert f"error: no space left on the device of {mnt}/run/checkpoints" in line


def test_bench_help_is_real_help():
    proc = subprocess.run(
        [sys.executable, "-m", "sparrow.bench.cli", "--help"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 0, proc.stderr
    from sparrow.bench.cli import COMMANDS

    for name in COMMANDS:  # the help lists every benchmark there is
        assert f"sparrow-bench {name}" in proc.stdout
