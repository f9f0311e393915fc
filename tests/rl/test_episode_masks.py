"""Observation tokens of multi-turn episodes (rollout/episodes.py) are out of everything a step
measures or trains: collated with completion_mask 0, the values at their positions move neither
the acceptance monitor (top-K bound, exact), the mismatch metrics, the sequence-level rollout
correction nor the loss's token count, whatever they hold."""

import torch

from sparrow.distributed import Ranks
from sparrow.monitor.acceptance_metrics import AcceptanceMetrics, ExactAcceptance
from sparrow.monitor.mismatch import mismatch_metrics
from sparrow.rl.batch import collate_rollouts
from sparrow.rl.policy_logprobs import LogprobOutput
from sparrow.rl.rollout_correction import sequence_tis
from sparrow.rollout.outputs import GenerationOutput

K = 4


def episode(gen, prompt: list[int], turns: list[int], observations: list[int]) -> GenerationOutput:
    """A fake episode: turns of the given lengths, observations of the given lengths between."""
    mask = []
    for t, o in zip(turns, [*observations, 0], strict=True):
        mask += [False] * t + [True] * o
    observed = torch.tensor(mask)
    n = len(mask)
    logprobs = torch.where(observed, 0.0, -torch.rand(n, generator=gen) * 3)
    return GenerationOutput(
        prompt_index=0,
        sample_index=0,
        prompt_ids=prompt,
        token_ids=torch.randint(5, 90, (n,), generator=gen).tolist(),
        text="",
        finish_reason="eos",
        logprobs=logprobs,
        sampling_logprobs=logprobs.clone(),
        topk_ids=torch.randint(5, 90, (n, K), generator=gen),
        topk_logprobs=-torch.rand(n, K, generator=gen) * 3,
        budget_pages=torch.full((n,), 2, dtype=torch.int32),
        context_lens=torch.arange(len(prompt), len(prompt) + n, dtype=torch.int32),
        num_preemptions=0,
        observation_mask=observed,
    )


def measured(batch, dense, exact) -> dict:
    ranks = Ranks(0, 1)
    floor = torch.zeros(len(batch), dtype=torch.bool)
    mask = batch.completion_mask
    result = AcceptanceMetrics(8, ranks).measure(batch, dense, floor, exact)
    metrics = result.metrics | mismatch_metrics(
        batch.sampled_logprobs, dense.token_logprobs, mask, 8, ranks
    )
    corr = sequence_tis(dense.token_logprobs, batch.sampled_logprobs, mask, cap=2.0)
    metrics["seq_tis_weight"] = corr.weight[mask].tolist()
    metrics["loss_tokens"] = int(mask.sum())
    return metrics


def test_values_at_observation_positions_move_no_metric_correction_or_count():
    gen = torch.Generator().manual_seed(0)
    prompt = [1, 2, 3, 4, 5]
    outputs = [
        episode(gen, prompt, [6, 4, 5], [9, 7]),
        episode(gen, prompt, [3, 8], [12]),
        episode(gen, prompt, [10], []),
    ]
    for i, o in enumerate(outputs):
        o.sample_index = i
    batch = collate_rollouts([prompt], outputs, pad_token_id=0)
    observed = torch.zeros_like(batch.completion_mask)
    for b, o in enumerate(outputs):
        observed[b, 5 : 5 + len(o.token_ids)] = o.observation_mask
    assert not (batch.completion_mask & observed).any()
    assert int(batch.completion_mask.sum()) == sum(
        int((~o.observation_mask).sum()) for o in outputs
    )
    shape = batch.input_ids.shape
    dense = LogprobOutput(
        -torch.rand(shape, generator=gen) * 3,
        torch.randint(5, 90, (*shape, K), generator=gen),
        -torch.rand(*shape, K, generator=gen) * 3,
        torch.rand(shape, generator=gen),
    )
    exact = ExactAcceptance(
        torch.rand(shape, generator=gen), torch.ones(len(batch), dtype=torch.bool)
    )
    before = measured(batch, dense, exact)
    # Anything at all at the observation positions, on both sides.
    noise = torch.randn(shape, generator=gen) * 50
    batch.sampled_logprobs = torch.where(observed, noise, batch.sampled_logprobs)
    batch.topk_logprobs[observed] = -50.0
    dense.token_logprobs = torch.where(observed, -noise, dense.token_logprobs)
    dense.topk_ids[observed] = 1
    exact.values = torch.where(observed, 0.0, exact.values)
    assert measured(batch, dense, exact) == before
