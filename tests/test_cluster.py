"""sparrow/cluster.py without a process group: how objects cross a Link (torch.save; a CUDA
tensor lands on the receiver's own device, on a CPU-only receiver its CPU, a CPU one stays on the
CPU), and how the push's backend is chosen and agreed (NCCL only when every rank has a GPU of its
own, told by its UUID). The links themselves run in tests/train/rollouts/test_remote_rollouts.py and
tests/rl/test_weight_push.py (gloo), and on GPUs in tests/test_cluster_gpu.py."""

from dataclasses import dataclass

import pytest
import torch

from sparrow.cluster import _push_backend, dumps, gpu_identity, landing, loads, local_device
from sparrow.train.config import ClusterConfig


@dataclass
class Drawn:
    step: int
    rows: torch.Tensor
    extra: dict


def test_an_object_with_tensors_crosses_whole_and_stays_on_the_cpu():
    base = torch.arange(12, dtype=torch.float32)
    sent = ("rows", Drawn(3, base[4:8].view(2, 2), {"ids": torch.tensor([7, 9]), "note": None}))
    kind, got = loads(dumps(sent), torch.device("cpu"))
    assert kind == "rows" and got.step == 3 and got.extra["note"] is None
    assert torch.equal(got.rows, torch.tensor([[4.0, 5.0], [6.0, 7.0]]))
    assert torch.equal(got.extra["ids"], torch.tensor([7, 9]))
    assert got.rows.device.type == "cpu"


def test_a_cuda_tensor_sent_to_a_cpu_only_rank_lands_on_its_cpu(monkeypatch):
    """The receiver is this process (land: the CPU); the sender's storages are tagged as torch.save
    tags a GPU rank's, so the bytes are what a CUDA tensor's are, with or without a GPU here."""
    base = torch.arange(12, dtype=torch.float32)
    sent = {"rows": base[4:8].view(2, 2), "ids": torch.tensor([7, 9])}
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:1")
        data = dumps(sent)
    assert b"cuda:1" in data  # the bytes name the sender's GPU
    got = loads(data, torch.device("cpu"))
    assert got["rows"].device == torch.device("cpu") and got["ids"].device == torch.device("cpu")
    assert torch.equal(got["rows"], torch.tensor([[4.0, 5.0], [6.0, 7.0]]))
    assert torch.equal(got["ids"], torch.tensor([7, 9]))


class Storage:
    """Records where `landing` sends it."""

    def __init__(self):
        self.moved_to = None

    def cuda(self, index):
        self.moved_to = index
        return self


@pytest.mark.parametrize(
    ("location", "land", "moved_to"),
    [
        ("cuda:3", torch.device("cuda", 1), 1),  # the sender's GPU index means nothing here
        ("cuda:0", torch.device("cpu"), None),  # a CPU-only receiver keeps it on the CPU
        ("cpu", torch.device("cuda", 1), None),  # a host tensor stays on the host
    ],
)
def test_landing_puts_gpu_storages_on_the_receivers_device_only(location, land, moved_to):
    storage = Storage()
    assert landing(land)(storage, location) is storage
    assert storage.moved_to == moved_to


class Bridge:
    def __init__(self, votes):
        self.votes = votes

    def gather_objects(self, mine):
        return self.votes


def test_the_push_backend_is_nccl_only_when_every_rank_has_a_gpu_of_its_own():
    own = ["a/GPU-0", "a/GPU-1", "b/GPU-0"]  # host/UUID: b's GPU-0 is another GPU
    assert _push_backend("auto", Bridge(own)) == "nccl"
    assert _push_backend("auto", Bridge(["a/GPU-0", "a/GPU-0"])) == "gloo"  # 1 + 1 on one GPU
    assert _push_backend("auto", Bridge([None, None])) == "gloo"  # CPU ranks
    assert _push_backend("gloo", Bridge(own)) == "gloo"
    assert _push_backend("nccl", Bridge(own)) == "nccl"
    with pytest.raises(ValueError, match=r"world ranks \[1, 2\] have none of their own"):
        _push_backend("nccl", Bridge(["a/GPU-0", "a/GPU-1", "a/GPU-1"]))
    with pytest.raises(ValueError, match=r"world ranks \[0\] have none"):
        _push_backend("nccl", Bridge([None, "a/GPU-1"]))


def test_ranks_deal_a_hosts_gpus_round_robin(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert local_device() == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert local_device() == torch.device("cpu") and gpu_identity() is None


def test_a_push_backend_outside_the_three_is_refused():
    with pytest.raises(ValueError, match="cluster.push_backend must be auto, nccl or gloo"):
        ClusterConfig(push_backend="mpi")
