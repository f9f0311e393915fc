"""The rehearsal harness itself: the guarded methods it reroutes compute what torch's bindings
compute, live bytes come and go with storages, the fused attention a GPU picks holds no score
matrix, host values answer only for what the host knows, a deep copy of fake tensors keeps their
fake mode, and no sparrow/ file imports any of it.
"""

import ast
import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fake_cuda import _getitem, _setitem, fake_cuda_runtime
from harness import fake_gpu
from host_values import HostValues
from live_bytes import LiveBytes
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

import sparrow

INDEXES = [
    1, (slice(None), slice(None, 2)), (Ellipsis, None, slice(1, 3)), (0, Ellipsis, -1),
    torch.tensor([2, 0]), (slice(None), torch.tensor([1, 0]), 2), [0, 2],
    torch.tensor([True, False, True]), (slice(1, None), torch.tensor([[0], [1]])),
]  # fmt: skip


@pytest.mark.parametrize("index", INDEXES, ids=str)
def test_rerouted_indexing_matches_the_binding(index):
    """The aten-level __getitem__/__setitem__ (run on real CPU tensors here) against torch's."""
    x = torch.arange(3 * 4 * 5.0).view(3, 4, 5)
    assert torch.equal(_getitem(x, index), x[index])
    expected, got = x.clone(), x.clone()
    expected[index] = -1.0
    _setitem(got, index, -1.0)
    assert torch.equal(got, expected)


def test_live_bytes_follow_storages_and_phases():
    with fake_cuda_runtime(), FakeTensorMode(), LiveBytes() as live:
        with live.phase("make") as phase:
            x = torch.empty(1000, device="cuda")  # 4,000 bytes
            view = x[:10]
            tmp = torch.empty(500, device="cuda")
            del tmp
        assert live.live["cuda"] == 4000 and phase.peak["cuda"] == 6000
        assert view.device.type == "cuda"
        del x, view
        assert live.live["cuda"] == 0 and live.peak["cuda"] == 6000


def test_cuda_attention_takes_the_fused_kernel():
    """bf16 SDPA without a mask on fake CUDA: flash's output and log-sum-exp, not the math
    path's (L, S) scores (32 MiB here)."""
    with fake_cuda_runtime(), FakeTensorMode(), LiveBytes() as live:
        q = torch.empty(1, 16, 1024, 128, device="cuda", dtype=torch.bfloat16)
        kv = torch.empty(1, 8, 1024, 128, device="cuda", dtype=torch.bfloat16)
        base = live.live["cuda"]
        with live.phase("attention") as phase:
            out = F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
        assert out.shape == q.shape and out.dtype == torch.bfloat16
        assert phase.peak["cuda"] - base < 2 * q.nbytes


def test_host_values_answer_for_host_data_only():
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, HostValues(mode):
        lengths = torch.tensor([3, 7, 5])
        mask = torch.arange(8) < lengths[:, None]  # (3, 8)
        hidden = torch.empty(3, 8, 16)  # an activation: no value
        assert int(lengths.max()) == 7 and mask.sum().item() == 15
        assert hidden[mask].shape == (15, 16)
        with pytest.raises(DataDependentOutputException):
            float(hidden.sum())


def test_a_deep_copy_of_fake_tensors_shares_their_mode():
    """DistillSparse deep-copies its base model; copying each tensor's FakeTensorMode with it
    corrupted the heap (the trainer rehearsal's process died at exit)."""
    with fake_gpu() as h:
        layer = torch.nn.Linear(4, 4, dtype=torch.bfloat16)
        twin = copy.deepcopy(layer)
    assert twin.weight.fake_mode is h.mode and twin.weight is not layer.weight
    assert twin.weight.shape == (4, 4) and twin.weight.dtype == torch.bfloat16


def test_no_sparrow_file_imports_the_harness():
    harness = {p.stem for p in Path(__file__).parent.glob("*.py")} | {"pytest", "tests"}
    root = Path(sparrow.__file__).parent
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in harness, f"{path}: imports {name}"
