"""The collectives of sparrow/distributed.py (and GracefulStop, the weight guard) under each
backend.

They reduce host numbers; NCCL reduces CUDA tensors only, so a CPU tensor handed to it raises
"No backend type associated with device type cpu" on the first multi-rank step. Each check runs
in a fresh 1-rank process group (a subprocess: the backend is fixed per process) with the rank
objects told world=2, so that every reduction really calls the collective; on 1 rank the result
must equal the local value. The NCCL case needs CUDA (run by scripts/gpu_check.sh).
"""

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hang_guard import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[2]

CHECK = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    from torch import nn
    from sparrow.distributed import Ranks, collective_device
    from sparrow.train.run.stop_in_loop import GracefulStop
    from sparrow.train.run.weight_guard import squared_norm

    backend = sys.argv[1]
    if backend == "nccl":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, rank=0, world_size=1)
    expected = "cuda" if backend == "nccl" else "cpu"
    assert collective_device().type == expected, collective_device()
    ranks = Ranks(0, 2)
    assert ranks.sum(2.5) == 2.5 and ranks.mean(3.0, 2) == 1.5
    assert ranks.extreme([0.2, 0.7], "min") == 0.2 and ranks.extreme([0.2, 0.7], "max") == 0.7
    assert ranks.sums({"a": 1.5, "b": 2.0}) == {"a": 1.5, "b": 2.0}
    assert ranks.from_rank0(lambda: "step_000002") == "step_000002"  # broadcast_object_list
    assert ranks.bounds(3) == (3.0, 3.0)
    ranks.barrier()
    grad = nn.Parameter(torch.ones(2, device=collective_device()))  # none yet: joins as zeros
    ranks.sum_gradients_([grad])
    assert grad.grad.tolist() == [0.0, 0.0]
    assert (Ranks.of_process_group().rank, Ranks.of_process_group().world) == (0, 1)
    assert GracefulStop().requested(2) is False
    layer = nn.Linear(3, 2)
    with torch.no_grad():
        layer.weight.fill_(1.0)
        layer.bias.fill_(2.0)
    assert squared_norm(layer, 2) == 6 * 1.0 + 2 * 4.0
    dist.destroy_process_group()
    print("ok")
    """
)


def run_check(backend: str, **extra) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE"}}
    path = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=path, **extra)
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, backend],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_host_reductions_under_gloo():
    run_check("gloo")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_host_reductions_under_nccl():
    run_check("nccl", CUDA_VISIBLE_DEVICES="0")
