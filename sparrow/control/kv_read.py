"""The KV-read ratio: KV pages the sparse layers read over the pages a dense decode would read,
summed over a batch's completion tokens. The one definition the trainer and experiments use."""

import torch
from torch import Tensor


def kv_pages(budget_pages: Tensor, completion_mask: Tensor, page_size: int) -> tuple[float, float]:
    """(pages read, pages a dense decode reads) over the completion tokens.

    budget_pages: (B, T) pages each token's decode step read (aligned like RolloutBatch);
    completion_mask: (B, T) bool. A token at absolute position t attends t tokens before it,
    ceil(t / page_size) pages when dense.
    """
    positions = torch.arange(completion_mask.shape[1]).expand_as(completion_mask)  # (B, T)
    dense = torch.div(positions + page_size - 1, page_size, rounding_mode="floor")  # ceil(t / P)
    return float(budget_pages[completion_mask].sum()), float(dense[completion_mask].sum())


def kv_read_ratio(budget_pages: Tensor, completion_mask: Tensor, page_size: int) -> float:
    read, dense = kv_pages(budget_pages, completion_mask, page_size)
    return read / max(dense, 1.0)
