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


def turn_index(attention_mask: Tensor, completion_mask: Tensor, prompt_lens: Tensor) -> Tensor:
    """Each token's assistant turn in a multi-turn episode, 1-based: 1 + the observations (runs
    of non-completion tokens after the prompt) before it; 0 on the prompt and the padding.

    attention_mask, completion_mask: (B, T) bool; prompt_lens: (B,).
    """
    positions = torch.arange(completion_mask.shape[1]).expand_as(completion_mask)  # (B, T)
    observed = attention_mask & ~completion_mask & (positions >= prompt_lens[:, None])  # (B, T)
    starts = observed & ~torch.nn.functional.pad(observed[:, :-1], (1, 0))  # (B, T)
    return torch.where(completion_mask, 1 + starts.long().cumsum(dim=1), 0)  # (B, T)


def kv_pages_by_turn(
    budget_pages: Tensor, completion_mask: Tensor, turns: Tensor, page_size: int
) -> dict[int, tuple[float, float]]:
    """kv_pages over each assistant turn's tokens: {turn: (pages read, dense pages)}.

    budget_pages, completion_mask: (B, T) as kv_pages; turns: (B, T) from turn_index.
    """
    return {
        int(t): kv_pages(budget_pages, completion_mask & (turns == t), page_size)
        for t in turns[completion_mask].unique().tolist()
    }


def kv_read_ratio(pages_read: float, pages_dense: float) -> float:
    return pages_read / max(pages_dense, 1.0)


def sparse_tokens(budget_pages: Tensor, completion_mask: Tensor, page_size: int) -> int:
    """Completion tokens decoded sparsely: their step read fewer pages than a dense one would.

    budget_pages, completion_mask: (B, T), aligned like RolloutBatch.
    """
    positions = torch.arange(completion_mask.shape[1]).expand_as(completion_mask)  # (B, T)
    sparse = budget_pages < dense_pages(positions, page_size)  # (B, T)
    return int((sparse & completion_mask).sum())
