"""The trainer's step pieces rehearsed on fake tensors at the real Qwen3-1.7B shape
(trainer_rehearsal.py): dense log-probs of a 32K-token micro-batch on the fake GPU, the weight
sync into the engine, forward + backward of that micro-batch with activation checkpointing (on
fake CPU tensors: autograd on fake CUDA aborts a CPU-only torch, so the backward's CUDA kernels,
their memory and device placement are not checked), a DistillSparse update (fake CPU, a 1K-token
batch) and its gated LoRA in a sparse engine decode step. DeepSpeed is not in it (its engine
needs a process group): ZeRO's partitioning, master weights and optimizer states are not
rehearsed. The host reads values only where the design does: the engine's sampled tokens,
DistillSparse's metrics and its per-chunk page-union width (a device sync per query chunk and
sparse layer on a GPU).
"""

from trainer_rehearsal import rehearse_trainer

GIB = 2**30
LAYERS = 28
T, K = 32768, 20  # one row: 4K prompt + 28K completion; the monitor's top-K
# What each phase does, counted rather than timed (a wall bound failed on a loaded machine):
# aten ops dispatched, measured at 8d8bad3 (14,214 / 933 / 108,205 / 94,274 / 3,395), with
# ~25% room. An op per token or per page where the design has one per layer or chunk breaks it.
MAX_OPS = {
    "actor log-probs": 18_000,
    "weight sync": 1_200,
    "actor step": 135_000,
    "distill step": 120_000,
    "gated decode": 4_500,
}


def test_trainer_step_pieces_run_on_fake_tensors_at_the_real_shape():
    report = rehearse_trainer()
    # The 32K-token budget holds one row of the two: two micro-batches, the first rehearsed.
    assert report.micro_batches == [slice(0, 1), slice(1, 2)]
    assert report.logprob_shapes == [(1, T), (1, T, K), (1, T, K), (1, T)]
    # Backward through the checkpointed layers reached every weight of the actor.
    assert report.grads == report.params == 2 + LAYERS * 11  # embedding (tied), final norm
    assert report.adapter_params == 2 * 7 * LAYERS  # A and B of q, k, v, o, gate, up, down
    assert {"distill/loss", "distill/k3", "distill/grad_norm"} <= set(report.distill_metrics)
    assert report.lora_modules == 7 * LAYERS
    # The gated LoRA's decode step ran eagerly: a captured graph cannot hold the per-row gate.
    assert report.gated_graphs == (0, 0, 0)
    sites = {site.split(":")[0] + " " + site.split(" ")[1] for site in report.host_reads}
    assert sites == {
        "sparrow/rollout/engine.py (_step)",
        "sparrow/distill/distill_sparse.py (step)",  # its metrics
        "sparrow/distill/distill_sparse.py (_update_adapter)",  # the gradient norm
        "sparrow/distill/page_gather_attention.py (_chunk_keys)",
    }
    # A 32K-token micro-batch with checkpointing: layer inputs, one layer's activations and
    # the bf16 gradients (3.2 GiB); the audit's estimate was 14-18 GiB.
    assert 3.2 * GIB < report.bytes["actor step"] < 24 * GIB
    assert report.bytes["weight sync"] == 0  # in place: no copy of the weights
    assert report.ops.keys() == MAX_OPS.keys()
    assert all(report.ops[k] < MAX_OPS[k] for k in MAX_OPS), report.ops
    print(
        f"\n[trainer rehearsal] ops {report.ops}; GiB beyond each phase's start: "
        + ", ".join(f"{k} {v / GIB:.2f}" for k, v in report.bytes.items())
        + f"; host reads {report.host_reads}"
    )
