"""GRPO advantages against hand-computed values and against verl 0.9.1's
`compute_grpo_outcome_advantage` (verl/trainer/ppo/core_algos.py), restated below from its
source: groups of one as verl's, equal scores exactly 0 where verl leaves rounding noise."""

import math
from collections import defaultdict

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
    expected = torch.tensor([a, -a, a, -a, 0.0, 0.0, 0.0, 5.0])  # group of one: 5 / (1 + 0)
    torch.testing.assert_close(adv, expected)


def test_eps_enters_the_denominator():
    adv = group_normalized_advantages(SCORES, GROUPS, eps=0.1)
    assert adv[0].item() == pytest.approx(0.5 / (math.sqrt(1 / 3) + 0.1), rel=1e-6)


def test_mean_only_variant():
    adv = group_mean_advantages(SCORES, GROUPS)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.5, -0.5, 0, 0, 0, 5.0]))


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
    # group 42, alone: verl's mean 0 and std 1; group 7: mean 1, std 1
    torch.testing.assert_close(adv, torch.tensor([3.0, -1.0, 0.0, 1.0]))
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


def _verl_grpo(scores, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    """verl 0.9.1 compute_grpo_outcome_advantage on (N,) scores (its token-level rewards' row
    sums), in their dtype."""
    scores = scores.clone()
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    for i in range(len(scores)):
        id2score[index[i]].append(scores[i])
    for idx, group in id2score.items():
        if len(group) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            stacked = torch.stack(group)
            id2mean[idx], id2std[idx] = torch.mean(stacked), torch.std(stacked)
    for i in range(len(scores)):
        centred = scores[i] - id2mean[index[i]]
        scores[i] = centred / (id2std[index[i]] + epsilon) if norm_adv_by_std_in_grpo else centred
    return scores


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_equal_to_verl_with_groups_of_one_and_near_equal_scores(norm_by_std):
    """Groups of 1, 3, 4 and 2 (the last two near-equal: 1e-12 and 1e-9 apart) in float64."""
    scores = torch.tensor(
        [0.7, 1.0, 0.0, 0.25, 0.5, 0.5 + 1e-12, 0.5, 0.5 - 3e-13, 2.0, 2.0 + 1e-9],
        dtype=torch.float64,
    )
    groups = [5, 1, 1, 1, 2, 2, 2, 2, 3, 3]
    fn = make_advantage_fn(AdvantageConfig(norm_by_std=norm_by_std, eps=1e-6))
    ours = fn(scores, torch.tensor(groups))
    verl = _verl_grpo(scores, groups, 1e-6, norm_by_std)
    torch.testing.assert_close(ours[1:], verl[1:], rtol=1e-9, atol=1e-12)
    # The group of one: verl's std is a float32 1, so its 1 + eps rounds (3e-8 relative).
    assert ours[0].item() == pytest.approx(0.7 / (1 + 1e-6) if norm_by_std else 0.7, rel=1e-15)
    assert ours[0].item() == pytest.approx(verl[0].item(), rel=1e-7)
    assert (ours[4:] != 0).any()  # near-equal scores are signal, as in verl


def test_equal_scores_are_zero_where_verl_leaves_rounding_noise():
    """Eight rewards of 0.7 in float32, as verl holds rewards: verl's mean rounds, and its
    advantages are that rounding over eps, 0.056 each, all of one sign; sparrow's are 0. Three
    rewards of 0.1 give verl 0 here (their float32 mean is exact)."""
    for value, n, verl_value in ((0.7, 8, 0.056), (0.1, 3, 0.0)):
        scores = torch.full((n,), value)
        verl = _verl_grpo(scores, [0] * n)
        assert verl.tolist() == pytest.approx([verl_value] * n, abs=1e-3)
        ours = make_advantage_fn(AdvantageConfig())(scores, torch.zeros(n, dtype=torch.long))
        assert ours.abs().max().item() == 0.0
