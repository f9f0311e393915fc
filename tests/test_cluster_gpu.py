"""sparrow/cluster.py on a GPU (scripts/gpu_check.sh ranks): what the CPU cannot run.

- An object with CUDA tensors crosses a Link's bytes onto the receiver's GPU, its CPU tensors
  onto the CPU (tests/test_cluster.py checks the placement rule itself).
- A Link over NCCL, built as split_world builds the push group (ProcessGroupNCCL called
  directly, PrefixStore, the timeout in its options): a broadcast of a CUDA tensor, an object
  broadcast and gather (their sizes and bytes as CUDA tensors), and a WeightPush of a layer's
  CUDA weights in bf16. One rank, in a subprocess (NCCL refuses two ranks on one GPU; the
  two-GPU push is `sparrow-bench push --device cuda`, which checks the received weights).
"""

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hang_guard import CHILD_GUARD_S, HANG_GUARD_S

from sparrow.cluster import dumps, loads

REPO = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

CHECK = textwrap.dedent(
    """
    import sys
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    from sparrow.cluster import Link, _group
    from sparrow.rollout.weight_push import WeightPush

    gpu = torch.device("cuda", 0)
    torch.cuda.set_device(gpu)
    timeout = timedelta(seconds=float(sys.argv[2]))  # CHILD_GUARD_S
    store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 1, is_master=True, timeout=timeout)
    link = Link(_group("nccl", store, "push", 0, 1, timeout), 0, 1, gpu)
    t = torch.arange(5, dtype=torch.float32, device=gpu)
    link.broadcast(t, 0)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert link.broadcast_object(("push", 3), 0) == ("push", 3)
    (got,) = link.gather_objects({"rows": torch.arange(3, device=gpu), "host": torch.ones(2)})
    assert got["rows"].device == gpu and got["rows"].tolist() == [0, 1, 2]
    assert got["host"].device.type == "cpu"
    layer = torch.nn.Linear(4, 3).to(gpu)
    bucket = [(n, p) for n, p in layer.named_parameters()]
    stats = WeightPush(link, 0, 32, torch.bfloat16).send([bucket])  # 16 elements a message
    assert (stats.bytes, stats.messages) == (15 * 2, 1), stats
    print("ok")
    """
)


def test_objects_land_on_the_receivers_gpu_and_host_tensors_on_the_host():
    sent = {"rows": torch.arange(4, device="cuda"), "host": torch.ones(2)}
    got = loads(dumps(sent), torch.device("cuda", 0))
    assert got["rows"].device == torch.device("cuda", 0) and got["host"].device.type == "cpu"
    assert torch.equal(got["rows"].cpu(), torch.arange(4))
    on_cpu = loads(dumps(sent), torch.device("cpu"))
    assert on_cpu["rows"].device.type == "cpu"


def test_a_link_over_nccl_broadcasts_gathers_and_pushes_cuda_tensors():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE"}}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, str(port), str(CHILD_GUARD_S)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
