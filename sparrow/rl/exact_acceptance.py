"""Exact per-token acceptance of a rollout batch: sum_v min(p_dense, q_sparse) over the vocabulary.

The engine keeps only the rollout policy's top-K, whose lower bound is loose wherever the
distribution is flat (on SmolLM2 at T = 1 the K = 20 bound gives p5 ~0.6 for two *identical*
policies). Where a second decode pass is affordable (CPU runs, small batches), the engine
teacher-forces the sampled completions through the same sparse decode under the same schedule,
which reproduces the rollout distributions, and the dense actor's logits are compared with them
over the full vocabulary, micro-batch by micro-batch so that at most one micro-batch of dense
logits exists at a time.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from sparrow.acceptance import exact_acceptance
from sparrow.batch import RolloutBatch


@torch.no_grad()
def exact_batch_acceptance(
    engine,
    dense_model,
    batch: RolloutBatch,
    temperature: float,
    micro_batch_size: int,
    schedules: list | None = None,
) -> Tensor:
    """(B, T) fp32 exact acceptance at completion positions, 0 elsewhere.

    Call before the schedule changes: the engine's replay uses its current schedule, or
    `schedules[b]` per row when given (those the rows were rolled out with; None: dense).
    `dense_model` is the actor's HF model (under ZeRO-3 every rank must call this together).
    """
    temperature = temperature if temperature > 0 else 1.0
    prompts, completions = _split(batch)
    sparse_logits = engine.score(prompts, completions, schedules)  # list of (T_i, V)
    accept = torch.zeros(batch.input_ids.shape, dtype=torch.float32)  # (B, T)
    device = next(dense_model.parameters()).device
    for start in range(0, len(batch), micro_batch_size):
        rows = range(start, min(start + micro_batch_size, len(batch)))
        ids = batch.input_ids[start : rows.stop].to(device)  # (b, T)
        mask = batch.attention_mask[start : rows.stop].to(device)  # (b, T)
        dense_logits = dense_model(input_ids=ids, attention_mask=mask.long()).logits  # (b, T, V)
        for i, b in enumerate(rows):
            p0, n = int(batch.prompt_lens[b]), len(completions[b])
            # Logits at position t - 1 predict the token at t; completion tokens sit at p0..p0+n-1.
            dense = F.log_softmax(dense_logits[i, p0 - 1 : p0 - 1 + n].float() / temperature, -1)
            sparse = F.log_softmax(sparse_logits[b].to(device).float() / temperature, -1)
            accept[b, p0 : p0 + n] = exact_acceptance(dense, sparse).cpu()
        del dense_logits
    return accept


def _split(batch: RolloutBatch) -> tuple[list[list[int]], list[list[int]]]:
    prompts, completions = [], []
    for b in range(len(batch)):
        p0 = int(batch.prompt_lens[b])
        tokens = batch.input_ids[b][batch.attention_mask[b]].tolist()
        prompts.append(tokens[:p0])
        completions.append(tokens[p0:])
    return prompts, completions
