"""`cluster.rollout_ranks=1` on GPUs (scripts/gpu_check.sh ranks): a 2-rank launch of
`preset=tiny` with every rank on a GPU of this host, against the one-process staleness-1 run on
the GPU, as tests/train/test_rollout_ranks.py does on the CPU.

With two GPUs or more each rank has its own and the push runs over NCCL
(cluster.push_backend=auto); on one GPU both ranks share it and the push runs over gloo, its
buckets through host memory (NCCL refuses two ranks on one GPU, which `push_backend=nccl` says in
one line). Either way the bridge is gloo and the rows a rollout rank draws on its GPU land on the
trainer's. The runs should agree to the last bit, as on the CPU; the comparison allows a relative
1e-5 and prints the largest difference, so that a GPU's nondeterminism reads as such.
"""

import math

import pytest
import torch
from safetensors.torch import load_file
from test_lost_rank import _finish
from test_rollout_ranks import _launch, _rows, one_process_run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
RELATIVE = 1e-5


def _backend() -> str:
    return "nccl" if torch.cuda.device_count() >= 2 else "gloo"


def _largest_difference(a: dict, b: dict) -> tuple[float, str]:
    """The largest relative difference over the values of two runs' rows, and where."""
    worst = (0.0, "every value equal")
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    for step in a:
        assert a[step].keys() == b[step].keys(), (step, sorted(set(a[step]) ^ set(b[step])))
        for key, x in a[step].items():
            y = b[step][key]
            if isinstance(x, float) and isinstance(y, float):
                if math.isnan(x) and math.isnan(y):
                    continue
                rel = abs(x - y) / max(abs(x), abs(y), 1e-12)
            else:
                rel = 0.0 if x == y else math.inf
            if rel > worst[0]:
                worst = (rel, f"step {step} {key}: {x!r} vs {y!r}")
    return worst


def test_a_gpu_rollout_rank_run_equals_the_one_process_gpu_run(tmp_path):
    remote_dir, log = tmp_path / "remote", tmp_path / "remote.log"
    proc = _launch(remote_dir, log, gpu=True)
    assert _finish(proc, log) == 0, log.read_text()[-4000:]
    assert f"weights pushed in 64 MiB buckets over {_backend()}" in log.read_text()
    local = one_process_run(tmp_path, gpu=True)
    remote = _rows(remote_dir)
    assert [remote[s]["async/staleness"] for s in (1, 2, 3)] == [0.0, 1.0, 1.0]
    for row in remote.values():
        assert row.pop("sync/push_bytes") > 0
    worst, where = _largest_difference(remote, _rows(local))
    print(f"largest relative difference of the metrics: {worst:.3g} ({where})")
    assert worst <= RELATIVE, where
    a = load_file(str(remote_dir / "policy" / "model.safetensors"))
    b = load_file(str(local / "policy" / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=RELATIVE, atol=0.0, msg=name)


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="each rank has a GPU of its own")
def test_an_nccl_push_on_a_shared_gpu_is_refused_in_one_line(tmp_path):
    run_dir, log = tmp_path / "refused", tmp_path / "refused.log"
    proc = _launch(run_dir, log, extra=["cluster.push_backend=nccl"], gpu=True)
    assert _finish(proc, log) != 0
    assert "cluster.push_backend=nccl needs a GPU to each rank" in log.read_text()
    assert not (run_dir / "metrics.jsonl").exists()
