"""The weight push (sparrow/rollout/weight_push.py, DenseActor.weight_buckets) between the roles
of sparrow/cluster.py: a training rank's weights reach a rollout rank's engine exactly, over
several buckets and pieces of a tensor; under ZeRO-3 a rank holds only the bucket being pushed
gathered, and DeepSpeed sees only the training ranks; a rank lost on either side surfaces as a
lost peer.

The cases run tests/rl/push_worker.py under torchrun (gloo, CPU; 2 or 3 ranks, ~20 s each,
mostly start-up). Bucket sizes: 1,000 bytes (smaller than all but the norms: every matrix travels in
pieces), 40,000 (several tensors a bucket, the 76,800-byte embedding in pieces) and 1 MiB (the
whole tiny model in one message).
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hang_guard import HANG_GUARD_S

from sparrow.rollout.weight_push import WeightPush, plan_buckets

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from test_distributed import clean_env, free_port  # noqa: E402

WORKER = HERE / "push_worker.py"
BUCKETS = [1000, 40000, 1 << 20]


class CpuLink:
    """A link's device, for cutting messages without sending them."""

    device = torch.device("cpu")


def torchrun(out: Path, *args: str, ranks: int = 2) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks)]
    cmd += ["--master_port", str(free_port()), str(WORKER), "--out", str(out), *args]
    proc = subprocess.run(
        cmd,
        env=clean_env(),
        cwd=HERE.parents[1],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_plan_buckets_fills_each_bucket_in_order_and_isolates_larger_tensors():
    assert plan_buckets([4, 4, 4, 9, 2, 2], 8) == [[0, 1], [2], [3], [4, 5]]
    assert plan_buckets([3], 1) == [[0]]
    with pytest.raises(ValueError, match="positive"):
        plan_buckets([1], 0)


def test_messages_cut_a_bucket_at_the_cap_and_a_larger_tensor_into_pieces():
    push = WeightPush(CpuLink(), 0, 4 * 4, torch.float32)  # 4 elements
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
        WeightPush(CpuLink(), 0, 1, torch.float32)


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
    """World ranks 0 and 1 train one step under ZeRO-3, then push to world rank 2."""
    out = tmp_path_factory.mktemp("push_zero3")
    torchrun(out, "--mode", "zero3", "--bucket-bytes", "20000", str(1 << 20), ranks=3)
    load = torch.load
    return load(out / "zero3.pt", weights_only=False), load(out / "zero3_rollout.pt")


def test_roles_split_the_world_and_deepspeed_sees_only_the_trainers(zero3):
    trainer, rollout = zero3
    expected = [("train", 0, 2), ("train", 1, 2), ("rollout", 0, 1)]  # (role, rank, world size)
    assert trainer["seen"] == expected and rollout["seen"] == expected  # over the bridge
    assert trainer["actor_world"] == 2 and rollout["world"] == 1


def test_zero3_gathers_only_the_bucket_being_pushed(zero3):
    trainer, _ = zero3
    assert trainer["idle_gathered"] == 0  # every parameter partitioned between buckets
    largest = trainer["largest_tensor_bytes"]
    for run in trainer["runs"]:
        bucket = run["bucket_bytes"]
        assert len(run["sizes"]) > 1 or bucket >= sum(run["sizes"])
        # Gathered on the rank while a bucket is drawn: that bucket's weights, nothing else.
        assert run["gathered"] == run["sizes"]
        for size, count in zip(run["sizes"], run["counts"], strict=True):
            assert size <= bucket or count == 1  # over a bucket only as one larger tensor
        assert max(run["gathered"]) <= max(bucket, largest)


def test_zero3_buckets_hold_the_actors_weights(zero3):
    trainer, _ = zero3
    full = trainer["full"]
    for run in trainer["runs"]:
        # Every parameter once; the tied lm_head is the embedding, sent under its first name.
        assert set(run["weights"]) == set(full) - {"lm_head.weight"}
        assert all(torch.equal(run["weights"][k], full[k]) for k in run["weights"])


def test_zero3_trainers_push_their_updated_weights_to_the_rollout_rank(zero3):
    trainer, rollout = zero3
    want = rollout["want"]  # an engine built from the trainers' gathered weights
    for found, stats in zip(rollout["found"], trainer["pushed"], strict=True):
        assert all(torch.equal(found[k], want[k]) for k in want)
        assert stats.bytes == sum(
            p.numel() * 4 for k, p in trainer["full"].items() if k != "lm_head.weight"
        )


@pytest.mark.parametrize("die", [0, 1], ids=["trainer_lost", "rollout_rank_lost"])
def test_a_lost_rank_on_either_side_is_a_lost_peer(tmp_path, die):
    # World rank 0 trains, 1 rolls out; the survivor waits on the dead one over a link.
    torchrun(tmp_path, "--mode", "lost", "--die", str(die))
    survivor = "rollout" if die == 0 else "train"
    outcome = torch.load(tmp_path / f"lost_{survivor}.pt")
    assert outcome["raised"] is not None and "PeerLost" in outcome["raised"]
    assert outcome["lost_peer"]  # the CLI's test for its one-line lost-rank stop
