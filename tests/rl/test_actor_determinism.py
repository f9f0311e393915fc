"""The actor's update gradient is the same every time on the CPU (rl/deterministic_backward.py).

Eight groups share a 160-token prefix, so the group-shared pass indexes the prefix's KV cache out
to them with a repeated index; its backward on the CPU sums the eight rows with atomic adds in
thread order unless torch's deterministic mode is on. Without `deterministic_backward` around
the actor's backward, the 12 identical backwards here gave several distinct gradients (with two
threads); with it, one.
"""

import zlib

import pytest
import torch
from tiny_lm import VOCAB, grouped_batch, pg_loss_fn, tiny_causal_lm

from sparrow.rl.actor import ActorConfig, DenseActor


def _gradient_checksums(actor: DenseActor, batch: dict, repeats: int) -> set[int]:
    """The checksum of the whole gradient of `repeats` identical updates, none applied."""
    seen = set()

    def record_and_drop():
        grads = [p.grad for p in actor.model.parameters() if p.grad is not None]
        seen.add(zlib.crc32(b"".join(g.numpy().tobytes() for g in grads)))
        actor.engine.zero_grad()
        return 0.0, True  # as a skipped update: weights and optimizer untouched

    actor._optimizer_step = record_and_drop
    tokens = int(batch["completion_mask"].sum())
    for _ in range(repeats):
        actor.train_step(actor.micro_batches(batch), pg_loss_fn(tokens))
    return seen


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one thread adds in a fixed order")
def test_the_shared_prefix_gradient_is_the_same_every_time():
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(1, VOCAB, (160,), generator=gen)
    prompts = [torch.cat([prefix, torch.randint(1, VOCAB, (2,), generator=gen)]) for _ in range(8)]
    batch = grouped_batch(prompts, [[4, 3]] * 8, gen)
    cfg = ActorConfig(zero_stage=0, precision="fp32", lr=1e-3, micro_batch_size=16)
    actor = DenseActor(tiny_causal_lm("qwen3"), cfg)
    assert len(_gradient_checksums(actor, batch, repeats=12)) == 1
