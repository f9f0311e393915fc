"""Sampler: truncation sets, both log-probs, top-K, greedy, seeding, and the sampled frequencies."""

import math

import pytest
import torch

from sparrow.rollout.sampler import Sampler, truncate


def test_top_k_and_top_p_keep_the_right_sets():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(truncate(logits, 1.0, 2)).tolist() == [[False, False, True, True]]
    # Nucleus 0.7: 0.5 alone is short of it, 0.5 + 0.3 reaches it.
    assert torch.isinf(truncate(logits, 0.7, None)).tolist() == [[False, False, True, True]]
    assert torch.isinf(truncate(logits, 0.81, None)).tolist() == [[False, False, False, True]]
    assert torch.isinf(truncate(logits, 0.1, None)).tolist() == [[False, True, True, True]]
    assert truncate(logits, 1.0, None) is logits
    with pytest.raises(ValueError):
        truncate(logits, 0.0, None)


def test_full_vocab_and_truncated_logprobs_are_both_reported():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    sampler = Sampler(topk_logprobs=3, seed=0, device=torch.device("cpu"))
    out = sampler(torch.log(probs), temperature=1.0, top_k=2)
    token = out.token_ids.item()
    assert token in (0, 1)
    assert math.isclose(out.logprobs.item(), math.log(probs[0, token]), rel_tol=1e-5)
    renorm = probs[0, token] / 0.8  # the top-2 mass
    assert math.isclose(out.sampling_logprobs.item(), math.log(renorm), rel_tol=1e-5)
    assert out.topk_ids.tolist() == [[0, 1, 2]]
    assert torch.allclose(out.topk_logprobs, torch.log(probs[:, :3]))


def test_temperature_scales_the_reported_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    out = Sampler(3, 0, torch.device("cpu"))(logits, temperature=0.5)
    assert torch.allclose(out.topk_logprobs, torch.log_softmax(logits / 0.5, -1))


def test_greedy_takes_argmax_and_reports_temperature_one_logprobs():
    logits = torch.tensor([[0.1, 3.0, 0.2], [5.0, 0.0, 0.0]])
    out = Sampler(2, 0, torch.device("cpu"))(logits, temperature=0.0)
    assert out.token_ids.tolist() == [1, 0]
    assert torch.allclose(out.logprobs, torch.log_softmax(logits, -1)[[0, 1], [1, 0]])
    assert torch.equal(out.sampling_logprobs, torch.zeros(2))


def test_seeded_and_draws_follow_the_distribution():
    probs = torch.tensor([0.6, 0.25, 0.1, 0.05])
    logits = torch.log(probs).expand(20_000, 4)
    a = Sampler(2, seed=123, device=torch.device("cpu"))(logits, 1.0).token_ids
    b = Sampler(2, seed=123, device=torch.device("cpu"))(logits, 1.0).token_ids
    c = Sampler(2, seed=124, device=torch.device("cpu"))(logits, 1.0).token_ids
    assert torch.equal(a, b) and not torch.equal(a, c)
    freq = torch.bincount(a, minlength=4).float() / a.numel()
    assert torch.allclose(freq, probs, atol=0.015)
    # With top-p 0.8 only the first two tokens remain, renormalised.
    d = Sampler(2, seed=5, device=torch.device("cpu"))(logits, 1.0, top_p=0.8).token_ids
    freq = torch.bincount(d, minlength=4).float() / d.numel()
    assert torch.allclose(freq, torch.tensor([0.6, 0.25, 0, 0]) / 0.85, atol=0.015)
