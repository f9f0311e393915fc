"""Exact per-token acceptance of a rollout batch: sum_v min(p_dense, q_sparse) over the vocabulary.

The engine records only the rollout policy's top-K, whose lower bound is loose wherever the
distribution is flat (on SmolLM2 at T = 1 the K = 20 bound gives p5 ~0.6 for two *identical*
policies). The rollout distributions come from one of two places, per row:
- the raw logits the engine kept while sampling the row (`SamplingParams.return_logits`, carried
  as `RolloutBatch.rollout_logits`): no second pass, and exactly what each token was drawn from;
- else the engine teacher-forces the row's completion through the same sparse decode under the
  same schedule, which reproduces them (about one more rollout of those rows; after a preemption
  of a sparse row, an approximation, as the rollout recomputed its K/V densely).
The dense actor's logits are compared with them over the full vocabulary.

Both passes compute a GRPO group's prompt once. The engine's `score` prefills each distinct
prompt once and shares its KV pages between the rows that replay it. The dense actor runs each
group's prompt (a run of consecutive rows with equal prompt tokens) once into a KV cache, indexes
the cache out to the group's rows and runs their completions on it, with the helper of the
actor's group-shared log-prob pass (`group_shared_hidden`, rl/shared_prompt_passes.py):
P + sum(C_i - 1) decoder tokens per group instead of G (P + C). Logits are computed only where
they are compared (the last prompt position and the completion positions, never (b, T, V) over
prompts), one row at a time, so at most one row's dense logits exist beside the engine's.
"""

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from sparrow.control.acceptance import exact_acceptance
from sparrow.distributed import Ranks
from sparrow.rl.batch import RolloutBatch
from sparrow.rl.shared_prompt_passes import group_shared_hidden


@torch.no_grad()
def exact_batch_acceptance(
    engine,
    dense_model,
    batch: RolloutBatch,
    temperature: float,
    micro_batch_size: int,
    schedules: list | None = None,
    share_prefix: bool = True,
) -> Tensor:
    """(B, T) fp32 exact acceptance at completion positions, 0 elsewhere.

    Rows with kept rollout logits (`batch.rollout_logits`) read them; the others are replayed
    by the engine: call before the schedule changes, the replay uses its current schedule, or
    `schedules[b]` per row when given (those the rows were rolled out with; None: dense).
    `dense_model` is the actor's HF model (under ZeRO-3 every rank must call this together,
    with as many rows as the others). A micro-batch holds whole prompt groups, up to
    `micro_batch_size` rows or one group if it is larger, as in the actor's log-prob pass, and
    `share_prefix` (the actor's flag, the same on every rank) runs the groups' common token
    prefix once per micro-batch, as that pass does.
    """
    temperature = temperature if temperature > 0 else 1.0
    prompts, completions = prompt_and_completion_ids(batch)
    sparse_logits = rollout_logits(engine, batch, prompts, completions, schedules)  # (T_i, V)
    accept = torch.zeros(batch.input_ids.shape, dtype=torch.float32)  # (B, T)
    device = next(dense_model.parameters()).device
    runs = prompt_runs(prompts)  # (B,)
    head = dense_model.get_output_embeddings()
    for sl in _micro_batches(runs, micro_batch_size):
        hidden = group_shared_hidden(
            dense_model.get_decoder(),
            batch.input_ids[sl].to(device),
            batch.attention_mask[sl].to(device),
            batch.prompt_lens[sl].to(device),
            runs[sl].to(device),
            share_prefix,
        ).hidden  # (b, 1 + F, H)
        for i, b in enumerate(range(sl.start, sl.stop)):
            p0, n = int(batch.prompt_lens[b]), len(completions[b])
            # Row i's hidden state j predicts its completion token j, at position p0 + j.
            dense = F.log_softmax(head(hidden[i, :n]).float() / temperature, -1)  # (n, V)
            sparse = F.log_softmax(sparse_logits[b].to(device).float() / temperature, -1)
            accept[b, p0 : p0 + n] = exact_acceptance(dense, sparse).cpu()
    return accept


def rollout_logits(
    engine,
    batch: RolloutBatch,
    prompts: list[list[int]],
    completions: list[list[int]],
    schedules: list | None,
) -> list[Tensor]:
    """Per row (C_b, V): the logits the engine kept while sampling it, else its replay (one
    `engine.score` call for the rows without, none when every row has them)."""
    logits = list(batch.rollout_logits or [None] * len(batch))
    missing = [b for b, x in enumerate(logits) if x is None]
    if missing:
        replayed = engine.score(
            [prompts[b] for b in missing],
            [completions[b] for b in missing],
            None if schedules is None else [schedules[b] for b in missing],
        )
        for b, x in zip(missing, replayed, strict=True):
            logits[b] = x
    for b, x in enumerate(logits):
        assert x is not None, "the missing rows were replayed"
        if x.shape[0] != len(completions[b]):
            raise ValueError(f"row {b}: {x.shape[0]} logits for {len(completions[b])} tokens")
    return cast(list[Tensor], logits)  # every row: checked above


def measured_logits(engine, batch: RolloutBatch, rows: Tensor, schedules: list) -> list:
    """Per row of `batch`: for the `rows` (B,) bool, the rollout logits (C_b, V) their exact
    acceptance compares with (kept, else replayed under `schedules[b]`, one per row of the
    batch); None for the others. For the update's forward to measure (rl.dense_pass=update)."""
    index = torch.arange(len(batch))[rows]  # (b,)
    chosen = batch.select(index)
    prompts, completions = prompt_and_completion_ids(chosen)
    logits = rollout_logits(engine, chosen, prompts, completions, [schedules[b] for b in index])
    out: list[Tensor | None] = [None] * len(batch)
    for b, x in zip(index.tolist(), logits, strict=True):
        out[b] = x
    return out


def prompt_runs(prompts: list[list[int]]) -> Tensor:
    """(B,) int64 index of each row's run of consecutive rows with equal prompts (its group)."""
    runs = [0]
    for before, prompt in zip(prompts, prompts[1:], strict=False):
        runs.append(runs[-1] + (prompt != before))
    return torch.tensor(runs[: len(prompts)], dtype=torch.int64)


def _micro_batches(runs: Tensor, micro_batch_size: int) -> list[slice]:
    """Row ranges of whole runs packed up to `micro_batch_size` rows (a longer run alone).

    Under data parallelism the ranks' run structures may differ (a duplicated prompt merges two
    groups), and ZeRO-3 gathers weights at every module call, so the ranks' calls must come in
    the same order: one decoder pass per slice, then one head call per row. If the slice sizes
    differ anywhere (as many slices is not enough), every rank falls back to plain
    `micro_batch_size`-row slices (runs cut by a slice boundary then compute their prompt once
    per part).
    """
    num_rows = len(runs)
    starts = [0, *((runs[1:] != runs[:-1]).nonzero().squeeze(1) + 1).tolist()]
    ends = [*starts[1:], num_rows]
    slices: list[slice] = []
    for start, end in zip(starts, ends, strict=True):
        if slices and end - slices[-1].start <= micro_batch_size:
            slices[-1] = slice(slices[-1].start, end)
        else:
            slices.append(slice(start, end))
    if Ranks.of_process_group().all_equal([s.stop - s.start for s in slices]):
        return slices
    return [
        slice(s, min(s + micro_batch_size, num_rows)) for s in range(0, num_rows, micro_batch_size)
    ]


def prompt_and_completion_ids(batch: RolloutBatch) -> tuple[list[list[int]], list[list[int]]]:
    """Each row's prompt and completion token ids (padding dropped), as the engine saw them."""
    prompts, completions = [], []
    for b in range(len(batch)):
        p0 = int(batch.prompt_lens[b])
        tokens = batch.input_ids[b][batch.attention_mask[b]].tolist()
        prompts.append(tokens[:p0])
        completions.append(tokens[p0:])
    return prompts, completions
