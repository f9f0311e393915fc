"""Pages read by the sparse layers against the pages a dense decode would read."""

import torch

from sparrow.control.kv_read import kv_pages, kv_read_ratio


def test_kv_pages_counts_dense_pages_by_position():
    # One row: prompt at 0-4, completion at positions 5-8 (4 tokens), 4-token pages.
    mask = torch.tensor([[False] * 5 + [True] * 4])
    budget = torch.full(mask.shape, 2)
    read, dense = kv_pages(budget, mask, page_size=4)
    assert read == 8.0
    assert dense == 2 + 2 + 2 + 2  # ceil(5/4), ceil(6/4), ceil(7/4), ceil(8/4)
    assert kv_read_ratio(read, dense) == 1.0 and kv_read_ratio(0.0, 0.0) == 0.0


def test_turns_split_at_observations_and_read_per_turn():
    """Turn k's tokens are the model's after k - 1 observations (issue 62's KV-read per turn)."""
    from sparrow.control.kv_read import kv_pages_by_turn, turn_index

    # Row 0: prompt 0-3, turn 1 at 4-5, observation 6-7, turn 2 at 8-9, observation 10, turn 3
    # at 11, then padding. Row 1: prompt 0-1, one turn at 2-4, padding.
    attention = torch.tensor([[True] * 12 + [False] * 2, [True] * 5 + [False] * 9])
    completion = torch.zeros_like(attention)
    completion[0, [4, 5, 8, 9, 11]] = True
    completion[1, 2:5] = True
    prompt_lens = torch.tensor([4, 2])
    turns = turn_index(attention, completion, prompt_lens)
    assert turns[0].tolist() == [0, 0, 0, 0, 1, 1, 0, 0, 2, 2, 0, 3, 0, 0]
    assert turns[1].tolist() == [0, 0, 1, 1, 1] + [0] * 9
    budget = torch.full(attention.shape, 1)
    by_turn = kv_pages_by_turn(budget, completion, turns, page_size=4)
    # dense pages ceil(t / 4): turn 1 at 4, 5 (row 0) and 2, 3, 4 (row 1); turn 2 at 8, 9.
    assert by_turn == {1: (5.0, 1 + 2 + 1 + 1 + 1), 2: (2.0, 2 + 3), 3: (1.0, 3)}
