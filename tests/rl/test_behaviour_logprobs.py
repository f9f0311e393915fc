"""The IS weight's denominator is the distribution a token was drawn from (issue 33).

Under top-p the engine draws from q restricted to its nucleus and renormalised, q_S = q / S on
the kept set (S its mass). A weight pi / q_S is unbiased for expectations under any pi supported
on the kept set; pi / q (the full-vocabulary log-prob) is that weight divided by S, so every
estimate is off by the factor 1 / S (log-ratio off by -log S). Monte Carlo on a 6-token
categorical, through the real sampler, the batch collation and the tis weight.
"""

import math
from types import SimpleNamespace

import torch

from sparrow.rl.batch import collate_rollouts
from sparrow.rl.rollout_correction import token_tis
from sparrow.rollout.sampler import Sampler

SAMPLES = 200_000
TOP_P = 0.9
# The rollout policy q: its top-0.9 nucleus is tokens 0-2, kept mass S = 0.91.
Q = torch.tensor([0.50, 0.26, 0.15, 0.05, 0.03, 0.01])
PI = torch.tensor([0.2, 0.3, 0.5, 0.0, 0.0, 0.0])  # the policy trained, on the kept set
F = torch.tensor([1.0, -2.0, 3.0, 0.0, 0.0, 0.0])  # E_pi[F] = 0.2 - 0.6 + 1.5 = 1.1


def drawn_batch(top_p: float):
    """One row of SAMPLES completion tokens drawn from Q under top_p, collated as the trainer
    collates the engine's outputs."""
    logits = Q.log().expand(SAMPLES, -1).contiguous()
    out = Sampler(topk_logprobs=2, seed=0, device=torch.device("cpu"))(logits, 1.0, top_p)
    output = SimpleNamespace(
        prompt_index=0, prompt_ids=[7], token_ids=out.token_ids.tolist(),
        logprobs=out.logprobs, sampling_logprobs=out.sampling_logprobs,
        topk_ids=out.topk_ids, topk_logprobs=out.topk_logprobs,
        budget_pages=torch.zeros(SAMPLES, dtype=torch.int32), finish_reason="length",
    )  # fmt: skip
    return collate_rollouts([[7]], [output], pad_token_id=0)


def estimate(batch, rollout_logprobs) -> float:
    """sum_x w(x) F(x) / n, w the tis weight (cap far above any ratio here)."""
    tokens = batch.input_ids[:, 1:]
    old = PI.log()[tokens]  # (1, n) the trained policy's log-prob of each drawn token
    weights = token_tis(old, rollout_logprobs[:, 1:], batch.completion_mask[:, 1:], cap=1e6)
    return float((weights.weight * F[tokens]).mean())


def test_truncated_logprob_is_unbiased_and_the_full_one_is_off_by_the_kept_mass():
    batch = drawn_batch(TOP_P)
    kept = Q[:3].sum().item()
    assert batch.behaviour_logprobs is not None  # truncation: the drawn distribution differs
    assert set(batch.input_ids[0, 1:].tolist()) == {0, 1, 2}  # nothing outside the nucleus
    truth = float((PI * F).sum())
    # 200K draws: the estimator's standard error is ~0.006 here.
    assert abs(estimate(batch, batch.drawn_logprobs) - truth) < 0.03
    full = estimate(batch, batch.sampled_logprobs)
    assert abs(full - truth / kept) < 0.03  # off by 1 / S: log-ratio off by -log S
    assert abs(math.log(full / truth) + math.log(kept)) < 0.03
    assert abs(full - truth) > 0.08  # the test tells the two apart


def test_without_truncation_both_are_the_full_logprob():
    batch = drawn_batch(1.0)
    assert batch.behaviour_logprobs is None
    assert batch.drawn_logprobs is batch.sampled_logprobs
