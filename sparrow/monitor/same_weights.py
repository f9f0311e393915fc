"""The dense side of the acceptance from the weights that sampled the rows (asynchronous rollout).

With `rl.async.staleness=1` a step trains on rows sampled one weight version earlier. Compared
with the trainer's dense policy (the newer weights), the acceptance would measure the sparse
policy's error AND one update's drift, and the controller would spend budget on the drift. So the
monitor's dense side is taken on the rollout side instead, right after `generate` and before the
engine's weights change: the engine teacher-forces the monitored rows densely (`engine.score`
without a schedule, the same weights), and each token's kept sparse logits are compared with that
dense distribution over the full vocabulary (exact acceptance), its top-K beside them (the
paper's bound). The monitored rows are those whose logits the engine kept (`monitor.exact_fraction`
of the rows and the noise floor's); the cost is one dense replay of them, the work the actor's
exact-acceptance pass does in the synchronous loop (exact_acceptance.py).

    same = same_weights_dense(engine, batch, plan, temperature, topk)  # before weights change
    result = monitor.measure_same_weights(step, prompt_ids, batch, plan, same, stats)
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from sparrow.control.acceptance import exact_acceptance
from sparrow.monitor.exact_acceptance import prompt_and_completion_ids, rollout_logits
from sparrow.monitor.rollout_plan import RolloutPlan, exact_rows
from sparrow.rl.batch import RolloutBatch
from sparrow.rl.policy_logprobs import LogprobOutput


@dataclass
class SameWeightsDense:
    """Per monitored row, the dense policy of the weights that sampled it, beside its sparse one."""

    rows: Tensor  # (B,) bool, the monitored rows of the batch (b = rows.sum())
    exact: Tensor  # (b, T) fp32 exact acceptance sparse vs dense, 0 off the completion
    dense: LogprobOutput  # (b, T[, K]) the dense token log-probs and top-K (entropy (b, T))


@torch.no_grad()
def same_weights_dense(
    engine, batch: RolloutBatch, plan: RolloutPlan, temperature: float, topk: int, fraction: float
) -> SameWeightsDense:
    """The monitored rows of `batch` (plan.logit_rows, else every round(1 / `fraction`)-th row
    and the noise floor) scored densely by `engine` with the weights that sampled them: call
    right after generate, under the schedule the rows were rolled out with (rows without kept
    logits are replayed under it for their sparse side)."""
    rows = torch.tensor(plan.logit_rows) if plan.logit_rows is not None else None
    if rows is None:
        rows = exact_rows(plan.floor_rows, fraction)  # (B,) bool
    sub = batch.select(torch.arange(len(batch))[rows])
    prompts, completions = prompt_and_completion_ids(sub)
    schedules = None if plan.schedules is None else [plan.schedules[i] for i in _where(rows)]
    sparse_logits = rollout_logits(engine, sub, prompts, completions, schedules)  # (C_b, V)
    dense_logits = engine.score(prompts, completions, [None] * len(sub))  # (C_b, V), dense
    temperature = temperature if temperature > 0 else 1.0
    shape = sub.input_ids.shape  # (b, T)
    exact = torch.zeros(shape)
    token = torch.zeros(shape)
    entropy = torch.zeros(shape)
    top_ids = torch.zeros((*shape, topk), dtype=torch.int64)
    top_lp = torch.zeros((*shape, topk))
    for b, completion in enumerate(completions):
        p0, n = int(sub.prompt_lens[b]), len(completion)
        dense = F.log_softmax(dense_logits[b].float() / temperature, -1)  # (n, V)
        sparse = F.log_softmax(sparse_logits[b].float() / temperature, -1)  # (n, V)
        at = slice(p0, p0 + n)
        exact[b, at] = exact_acceptance(dense, sparse).cpu()
        ids = torch.tensor(completion, device=dense.device)
        token[b, at] = dense.gather(1, ids[:, None]).squeeze(1).cpu()
        entropy[b, at] = -(dense.exp() * dense).sum(-1).cpu()
        values, indices = dense.topk(topk, -1)  # (n, K)
        top_ids[b, at], top_lp[b, at] = indices.cpu(), values.cpu()
    return SameWeightsDense(rows, exact, LogprobOutput(token, top_ids, top_lp, entropy))


def _where(rows: Tensor) -> list[int]:
    return rows.nonzero().squeeze(1).tolist()
