"""The weight push (sparrow/rollout/weight_push.py, DenseActor.weight_buckets): a training rank's
weights reach a rollout rank's engine exactly, over several buckets and pieces of a tensor, and
under ZeRO-3 a rank holds only the bucket being pushed gathered.

The two-rank cases run tests/rl/push_worker.py under torchrun (gloo, CPU; ~20 s each, mostly
start-up). Bucket sizes: 1,000 bytes (smaller than all but the norms: every matrix travels in
pieces), 40,000 (several tensors a bucket, the 76,800-byte embedding in pieces) and 1 MiB (the
whole tiny model in one message).
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sparrow.rollout.weight_push import WeightPush, plan_buckets

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from test_distributed import clean_env, free_port  # noqa: E402

WORKER = HERE / "push_worker.py"
BUCKETS = [1000, 40000, 1 << 20]


def torchrun(out: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--master_port", str(free_port()), str(WORKER), "--out", str(out), *args]
    proc = subprocess.run(
        cmd, env=clean_env(), cwd=HERE.parents[1], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_plan_buckets_fills_each_bucket_in_order_and_isolates_larger_tensors():
    assert plan_buckets([4, 4, 4, 9, 2, 2], 8) == [[0, 1], [2], [3], [4, 5]]
    assert plan_buckets([3], 1) == [[0]]
    with pytest.raises(ValueError, match="positive"):
        plan_buckets([1], 0)


def test_messages_cut_a_bucket_at_the_cap_and_a_larger_tensor_into_pieces():
    push = WeightPush(None, 0, 4 * 4, torch.float32, torch.device("cpu"))  # 4 elements
    bucket = [("a", torch.zeros(2)), ("b", torch.zeros(2)), ("c", torch.zeros(2, 5))]
    bucket.append(("d", torch.zeros(1)))
    messages = [pieces for pieces, _ in push._messages(bucket)]
    assert messages == [
        [("a", (2,), 0, 2), ("b", (2,), 0, 2)],
        [("c", (2, 5), 0, 4)],
        [("c", (2, 5), 4, 4)],
        [("c", (2, 5), 8, 2)],
        [("d", (1,), 0, 1)],
    ]
    with pytest.raises(ValueError, match="holds no"):
        WeightPush(None, 0, 1, torch.float32, torch.device("cpu"))


@pytest.fixture(scope="module")
def wire(tmp_path_factory):
    out = tmp_path_factory.mktemp("push_wire")
    torchrun(out, "--mode", "wire", "--bucket-bytes", *map(str, BUCKETS))
    return torch.load(out / "wire.pt", weights_only=False)


def test_pushed_engine_equals_an_engine_built_from_the_senders_weights(wire):
    # Tied (llama) and untied (qwen3: its lm_head travels too), fp32 and bf16 engines.
    assert len(wire) == 2 * 2 * len(BUCKETS)
    for case in wire:
        label = f"{case['family']} {case['dtype']} {case['bucket_bytes']}"
        want = case["want"]
        assert any(not torch.equal(case["before"][k], want[k]) for k in want), label
        assert all(torch.equal(case["after"][k], want[k]) for k in want), label
        assert torch.equal(case["logits"], case["want_logits"]), label


def test_push_sends_each_weight_once_in_the_engines_dtype_within_the_bucket(wire):
    for case in wire:
        stats, bucket = case["stats"], case["bucket_bytes"]
        # Tied embeddings once: the bytes are the unique parameters' at the engine's dtype.
        assert stats.bytes == case["unique_bytes"]
        assert stats.messages >= -(-stats.bytes // bucket)  # no message over a bucket
        # The largest tensor alone took as many messages as it has buckets' worth of bytes.
        assert stats.messages >= -(-case["largest_tensor_bytes"] // bucket)
        if bucket >= stats.bytes:
            assert stats.messages == 1


@pytest.fixture(scope="module")
def zero3(tmp_path_factory):
    out = tmp_path_factory.mktemp("push_zero3")
    torchrun(out, "--mode", "zero3", "--bucket-bytes", "20000", "80000", str(1 << 20))
    return torch.load(out / "zero3.pt", weights_only=False)


def test_zero3_gathers_only_the_bucket_being_pushed(zero3):
    assert zero3["idle_gathered"] == 0  # every parameter partitioned between buckets
    largest = zero3["largest_tensor_bytes"]
    for run in zero3["runs"]:
        bucket = run["bucket_bytes"]
        assert len(run["sizes"]) > 1 or bucket >= sum(run["sizes"])
        # Gathered on the rank while a bucket is drawn: that bucket's weights, nothing else.
        assert run["gathered"] == run["sizes"]
        for size, count in zip(run["sizes"], run["counts"], strict=True):
            assert size <= bucket or count == 1  # over a bucket only as one larger tensor
        assert max(run["gathered"]) <= max(bucket, largest)


def test_zero3_buckets_hold_the_actors_weights(zero3):
    full = zero3["full"]
    for run in zero3["runs"]:
        # Every parameter once; the tied lm_head is the embedding, sent under its first name.
        assert set(run["weights"]) == set(full) - {"lm_head.weight"}
        assert all(torch.equal(run["weights"][k], full[k]) for k in run["weights"])
