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
