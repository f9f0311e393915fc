"""The KV-read ratio: KV pages the sparse layers read over the pages a dense decode would read,
summed over completion tokens; and the count of sparsely decoded tokens (those that read fewer
pages than their context holds: the tokens a DistillSparse adapter acts on and learns from). The
one definition the trainer, calibration and experiments use."""

import torch
from torch import Tensor


def dense_pages(positions: Tensor, page_size: int) -> Tensor:
    """Pages a dense decode step reads for the token at each absolute position t (it attends the
    t tokens before it): ceil(t / page_size), same shape as `positions`."""
    return torch.div(positions + page_size - 1, page_size, rounding_mode="floor")


def kv_pages(budget_pages: Tensor, completion_mask: Tensor, page_size: int) -> tuple[float, float]:
    """(pages read, pages a dense decode reads) over a batch's completion tokens.

    budget_pages: (B, T) pages each token's decode step read (aligned like RolloutBatch);
    completion_mask: (B, T) bool.
    """
    positions = torch.arange(completion_mask.shape[1]).expand_as(completion_mask)  # (B, T)
    dense = dense_pages(positions, page_size)  # (B, T)
    return float(budget_pages[completion_mask].sum()), float(dense[completion_mask].sum())


def kv_read_ratio(pages_read: float, pages_dense: float) -> float:
    return pages_read / max(pages_dense, 1.0)


def sparse_tokens(budget_pages: Tensor, completion_mask: Tensor, page_size: int) -> int:
    """Completion tokens decoded sparsely: their step read fewer pages than a dense one would.

    budget_pages, completion_mask: (B, T), aligned like RolloutBatch.
    """
    positions = torch.arange(completion_mask.shape[1]).expand_as(completion_mask)  # (B, T)
    sparse = budget_pages < dense_pages(positions, page_size)  # (B, T)
    return int((sparse & completion_mask).sum())
