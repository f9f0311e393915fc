"""GRPO advantages against hand-computed values."""

import math

import pytest
import torch

from sparrow.rl.advantages import (
    AdvantageConfig,
    broadcast_to_tokens,
    group_mean_advantages,
    group_normalized_advantages,
    make_advantage_fn,
)

# group 0: a spread group; group 1: all equal; group 2: a single sample.
SCORES = torch.tensor([1.0, 0.0, 1.0, 0.0, 2.0, 2.0, 2.0, 5.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2])


def test_normalized_by_unbiased_std():
    adv = group_normalized_advantages(SCORES, GROUPS, eps=0.0)
    # mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3)
    a = 0.5 / math.sqrt(1 / 3)
    expected = torch.tensor([a, -a, a, -a, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected)


def test_eps_enters_the_denominator():
    adv = group_normalized_advantages(SCORES, GROUPS, eps=0.1)
    assert adv[0].item() == pytest.approx(0.5 / (math.sqrt(1 / 3) + 0.1), rel=1e-6)


def test_mean_only_variant():
    adv = group_mean_advantages(SCORES, GROUPS)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.5, -0.5, 0, 0, 0, 0.0]))


def test_zero_std_group_is_exactly_zero_despite_rounding():
    # 0.1 is inexact in binary: a mean-based check would leave ~1e-9 residue, amplified by 1/eps.
    scores = torch.full((3,), 0.1)
    groups = torch.zeros(3, dtype=torch.long)
    assert group_normalized_advantages(scores, groups, eps=1e-12).abs().max().item() == 0.0
    assert group_mean_advantages(scores, groups).abs().max().item() == 0.0


def test_single_sample_groups_and_arbitrary_ids():
    scores = torch.tensor([3.0, 0.0, 1.0, 2.0])
    groups = torch.tensor([42, 7, 7, 7])  # ids need not be contiguous or sorted
    adv = group_normalized_advantages(scores, groups, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([0.0, -1.0, 0.0, 1.0]))  # mean 1, std 1
    assert not torch.isnan(adv).any()


def test_factory_picks_variant_and_broadcast():
    fn = make_advantage_fn(AdvantageConfig(norm_by_std=False))
    adv = fn(SCORES, GROUPS)
    assert adv[0].item() == pytest.approx(0.5)
    mask = torch.tensor([[False, True, True], [False, False, True]])
    tok = broadcast_to_tokens(torch.tensor([2.0, -1.0]), mask)
    torch.testing.assert_close(tok, torch.tensor([[0.0, 2.0, 2.0], [0.0, 0.0, -1.0]]))
    fn_std = make_advantage_fn(AdvantageConfig(norm_by_std=True, eps=0.0))
    assert fn_std(SCORES, GROUPS)[0].item() == pytest.approx(0.5 / math.sqrt(1 / 3), rel=1e-6)
