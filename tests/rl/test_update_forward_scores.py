"""rl.dense_pass=update: the update's own forward hands back what the separate no-grad pass
gave (token log-probs, top-K, entropy) and, for rows given rollout logits, the exact acceptance
sum_v min(p_dense, q_rollout) from its chunked head; per-row and group-shared layouts, one and
several micro-batches, chunks that cut completions."""

import copy

import pytest
import torch
import torch.nn.functional as F
from tiny_lm import VOCAB, grouped_batch, pg_loss_fn, tiny_causal_lm

from sparrow.control.acceptance import exact_acceptance
from sparrow.rl.actor import DenseActor
from sparrow.rl.actor_config import ActorConfig
from sparrow.rl.policy_logprobs import ForwardScores

GROUPS = [(9, [4, 1, 6, 3]), (5, [7, 2, 7])]  # (prompt length, completion lengths) per group
TEMPERATURE, TOPK = 0.7, 4
MEASURED = [0, 2, 3, 6]  # rows with rollout logits (a one-token completion among them)


def _batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, VOCAB, (p,), generator=gen) for p, _ in GROUPS]
    return grouped_batch(prompts, [lens for _, lens in GROUPS], gen, first_id=7)


def _rollout_logits(batch) -> list:
    """Random (C_b, V) logits for the MEASURED rows, None for the others."""
    gen = torch.Generator().manual_seed(5)
    counts = batch["completion_mask"].sum(1).tolist()
    return [
        torch.randn(counts[b], VOCAB, generator=gen) * 3 if b in MEASURED else None
        for b in range(len(counts))
    ]


def _reference_exact(model, batch, logits) -> torch.Tensor:
    """(B, T) exact acceptance from a plain HF forward of each row alone."""
    out = torch.zeros(batch["input_ids"].shape)
    with torch.no_grad():
        for b, q in enumerate(logits):
            if q is None:
                continue
            n = int(batch["attention_mask"][b].sum())
            p0 = int(batch["prompt_lens"][b])
            dense = model(batch["input_ids"][b : b + 1, :n]).logits[0].float() / TEMPERATURE
            # Position t is predicted by the logits at t - 1.
            p = F.log_softmax(dense[p0 - 1 : n - 1], -1)
            out[b, p0:n] = exact_acceptance(p, F.log_softmax(q / TEMPERATURE, -1))
    return out


@pytest.mark.parametrize("share", [False, True])  # per-row / group-shared layout
@pytest.mark.parametrize("micro_batch_size", [3, 7])  # three micro-batches / one
def test_update_forward_gives_the_separate_pass(share, micro_batch_size):
    batch = _batch()
    model = tiny_causal_lm("qwen3")
    cfg = ActorConfig(
        zero_stage=0, lr=1e-3, micro_batch_size=micro_batch_size, precision="fp32",
        share_prompts=share, logprob_chunk_tokens=6,
    )  # fmt: skip
    separate_actor = DenseActor(copy.deepcopy(model), cfg)
    separate = separate_actor.compute_logprobs(
        batch["input_ids"], batch["attention_mask"], TOPK, TEMPERATURE,
        batch["prompt_lens"], batch["group_ids"],
    )  # fmt: skip
    logits = _rollout_logits(batch)
    actor = DenseActor(copy.deepcopy(model), cfg)
    keep = ForwardScores(TOPK)
    tokens = int(batch["completion_mask"].sum())
    micro_batches = actor.micro_batches(batch | {"rollout_logits": logits})
    assert (len(micro_batches) > 1) == (micro_batch_size == 3)
    actor.train_step(micro_batches, pg_loss_fn(tokens), TEMPERATURE, keep=keep)
    dense, exact = keep.output()

    for name in ("token_logprobs", "topk_logprobs", "entropy"):
        diff = (getattr(dense, name) - getattr(separate, name)).abs().max()
        assert diff <= 1e-6, (name, float(diff))
    assert torch.equal(dense.topk_ids, separate.topk_ids)
    assert not dense.token_logprobs.requires_grad
    reference = _reference_exact(model, batch, logits)
    assert exact is not None and float((exact - reference).abs().max()) <= 1e-5
    measured = torch.zeros(len(logits), dtype=torch.bool)
    measured[MEASURED] = True
    # Exactly the measured rows' completion tokens carry an acceptance, each in (0, 1].
    on = batch["completion_mask"] & measured[:, None]
    assert (exact[~on] == 0).all() and (exact[on] > 0).all() and (exact[on] <= 1 + 1e-6).all()
    # ... and the update ran: theta moved.
    before, after = separate_actor.gathered_state_dict(), actor.gathered_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_no_rollout_logits_no_exact():
    """Without rollout logits the forward keeps four scores and no acceptance."""
    batch = _batch()
    cfg = ActorConfig(zero_stage=0, lr=1e-3, micro_batch_size=7, precision="fp32")
    actor = DenseActor(tiny_causal_lm("qwen3"), cfg)
    keep = ForwardScores(TOPK)
    tokens = int(batch["completion_mask"].sum())
    actor.train_step(actor.micro_batches(batch), pg_loss_fn(tokens), TEMPERATURE, keep=keep)
    dense, exact = keep.output()
    assert exact is None and dense.topk_ids.shape[-1] == TOPK
