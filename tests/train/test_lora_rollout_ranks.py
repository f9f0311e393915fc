"""LoRA RL with a rollout rank (`cluster.rollout_ranks=1`, a real 1 + 1 torchrun launch on CPU):
what goes over the wire after every update is the adapter, its bytes exactly the adapter's
(32,768 parameters at rank 8 on the tiny model, fp32: 131,072 bytes, against 694,016 of full
weights), and the rollout rank applies it: the run equals the one-process LoRA run in every
step's metrics (the push's own keys aside) and in its exported adapter and merged weights. Were
the adapter lost on the way, the rollout rank would draw from the base and the rewards differ."""

import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S
from test_lost_rank import _env, _finish
from test_rollout_ranks import COMMON, PAUSE_AT, ROOT, _launch, _rows

LORA = ["actor.lora.rank=8", "actor.lr=1e-2"]
ADAPTER_BYTES = 131_072
EXPORTS = ("policy/adapter/adapter_model.safetensors", "policy/model.safetensors")


def _one_process(tmp_path: Path) -> Path:
    local, log = tmp_path / "local", tmp_path / "local.log"
    env = _env()
    env.pop("PAUSE_AT_RANK")
    cmd = [sys.executable, str(PAUSE_AT), "none", "0", str(tmp_path / "none"), *COMMON, *LORA]
    with open(log, "w") as out:
        done = subprocess.run([*cmd, f"run_dir={local}"], cwd=ROOT, env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=HANG_GUARD_S)  # fmt: skip
    assert done.returncode == 0, log.read_text()[-4000:]
    return local


@pytest.mark.slow
def test_the_adapter_goes_over_the_wire_and_the_run_equals_the_one_process_run(tmp_path):
    remote_dir, log = tmp_path / "remote", tmp_path / "remote.log"
    assert _finish(_launch(remote_dir, log, extra=LORA), log) == 0, log.read_text()[-4000:]
    local, remote = _rows(_one_process(tmp_path)), _rows(remote_dir)
    for row in remote.values():
        assert row.pop("sync/push_bytes") == ADAPTER_BYTES  # the adapter alone, every update
        assert row["sync/engine_bytes"] == ADAPTER_BYTES
    assert len({row["reward/mean"] for row in remote.values()}) > 1  # the adapter moves
    assert remote == local
    for name in EXPORTS:
        assert (remote_dir / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
