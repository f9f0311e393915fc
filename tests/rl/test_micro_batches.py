"""Cutting a step's rows into micro-batches by a token budget: groups kept whole where a fresh
micro-batch holds them, split row-wise where not, as many micro-batches on every rank."""

import pytest
import torch

from sparrow.rl.micro_batches import even_out, layout_tokens, token_budget_slices


def _rows(spec):
    """spec: [(prompt_len, [completion lens])] per group -> lengths, prompt_lens, group_ids."""
    rows = [(g, p, p + c) for g, (p, lens) in enumerate(spec) for c in lens]
    return (
        torch.tensor([n for _, _, n in rows]),
        torch.tensor([p for _, p, _ in rows]),
        torch.tensor([g for g, _, _ in rows]),
    )


def test_layout_tokens_counts_the_padded_passes():
    lengths, prompts, groups = _rows([(10, [5, 3]), (4, [8])])
    assert layout_tokens(lengths) == 3 * 15  # per row: (3, 15)
    # Shared: two prompt rows of 10 (padded) plus three completion rows of 8.
    assert layout_tokens(lengths, prompts, groups) == 2 * 10 + 3 * 8


def test_groups_that_fit_stay_whole():
    lengths, prompts, groups = _rows([(4, [10] * 4), (4, [10] * 4), (4, [10] * 4)])
    # One group costs 4 + 4 * 10 = 44; two cost 88.
    assert token_budget_slices(lengths, 88, prompts, groups) == [slice(0, 8), slice(8, 12)]
    # 60 holds one group but not a group and a half: no group is cut.
    assert token_budget_slices(lengths, 60, prompts, groups) == [
        slice(0, 4),
        slice(4, 8),
        slice(8, 12),
    ]


def test_a_group_over_the_budget_is_split_row_wise():
    lengths, prompts, groups = _rows([(10, [20] * 8)])  # whole: 10 + 8 * 20 = 170 tokens
    slices = token_budget_slices(lengths, 70, prompts, groups)
    # 10 + 3 * 20 = 70 fits, a fourth row does not.
    assert slices == [slice(0, 3), slice(3, 6), slice(6, 8)]
    for sl in slices:
        assert layout_tokens(lengths[sl], prompts[sl], groups[sl]) <= 70
    # A budget below one row still gives every row a micro-batch.
    assert token_budget_slices(lengths, 5, prompts, groups) == [slice(r, r + 1) for r in range(8)]


def test_long_prompts_count_once_per_row_they_are_held_for():
    """The policy computes a group's prompt once but holds its K/V for every row: 4 rows of a
    100-token prompt hold 400 tokens of K/V though the layout is 100 + 4 * 2 = 108."""
    lengths, prompts, groups = _rows([(100, [2] * 4), (100, [2] * 4)])
    slices = token_budget_slices(lengths, 250, prompts, groups)
    assert slices == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    for sl in slices:
        assert (sl.stop - sl.start) * int(prompts[sl].max()) <= 250


def test_memory_follows_the_budget_not_the_group_size():
    for group in (8, 32):
        lengths, prompts, groups = _rows([(16, [64] * group)])
        slices = token_budget_slices(lengths, 16 + 4 * 64, prompts, groups)
        assert len(slices) == group // 4
        assert {sl.stop - sl.start for sl in slices} == {4}


def test_unshared_rows_pack_by_padded_length():
    lengths = torch.tensor([10, 30, 10, 10])
    assert token_budget_slices(lengths, 60) == [slice(0, 2), slice(2, 4)]


def test_even_out_splits_the_widest():
    assert even_out([slice(0, 4), slice(4, 5)], 3) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert even_out([slice(0, 2)], 2) == [slice(0, 1), slice(1, 2)]
    with pytest.raises(ValueError, match="cannot fill"):
        even_out([slice(0, 1)], 2)
