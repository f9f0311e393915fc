"""Paged KV cache layout, KV writes and per-page key summaries.

Layout (one layer): `k_cache`, `v_cache` are (num_pages, PAGE_SIZE, H_kv, D); a sequence's page
table maps its logical pages 0..n-1 to physical page ids, and token t lives at logical page
t // PAGE_SIZE, offset t % PAGE_SIZE. Each physical page carries a `PageSummary` row: the centroid
of its valid keys (the Sparrow paper's page score) or their channel-wise min/max (Quest's upper
bound on q.k, arXiv 2406.10774), whichever the score mode reads. Plain torch index ops: they
run on CPU and CUDA alike and read only the pages they touch, so no Triton kernel is needed here.
"""

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class PageSummary:
    """Per-layer key summaries of every physical page. A table the score mode never reads is None
    (Quest reads min/max, "centroid" the mean): it is neither allocated nor written."""

    k_mean: Tensor | None  # (num_pages, H_kv, D) centroid of the page's valid keys
    k_min: Tensor | None  # (num_pages, H_kv, D) channel-wise min of valid keys
    k_max: Tensor | None  # (num_pages, H_kv, D) channel-wise max of valid keys

    @property
    def tables(self) -> list[Tensor]:
        """The tables that exist (at least one)."""
        return [t for t in (self.k_mean, self.k_min, self.k_max) if t is not None]

    @property
    def num_kv_heads(self) -> int:
        return self.tables[0].shape[1]

    @staticmethod
    def empty(
        num_pages: int,
        num_kv_heads: int,
        head_dim: int,
        device: torch.device | str,
        *,
        score: str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> "PageSummary":
        """Zeroed tables for `score` ("quest": min/max, "centroid": mean; None: all three), in
        `dtype`. The cache dtype loses nothing for min/max (they are keys) and rounds the mean
        once; on a GPU it halves what Quest scoring reads per page against fp32."""
        shape = (num_pages, num_kv_heads, head_dim)

        def table(*modes: str) -> Tensor | None:
            if score is not None and score not in modes:
                return None
            return torch.zeros(shape, dtype=dtype, device=device)

        return PageSummary(k_mean=table("centroid"), k_min=table("quest"), k_max=table("quest"))


def write_kv(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slot_mapping: Tensor) -> None:
    """Write N new tokens' keys/values in place at `slot_mapping` = page * PAGE_SIZE + offset."""
    _check_cache_pair(k_cache, v_cache)
    num_pages, page_size, num_kv_heads, head_dim = k_cache.shape
    expected = (slot_mapping.shape[0], num_kv_heads, head_dim)
    if slot_mapping.dim() != 1 or tuple(k.shape) != expected or tuple(v.shape) != expected:
        raise ValueError(
            f"write_kv: k, v must be (N, H_kv, D) = {expected} with slot_mapping (N,); got "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}, slot_mapping {tuple(slot_mapping.shape)}"
        )
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"write_kv: slot_mapping must be int32/int64, got {slot_mapping.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(
            "write_kv: k_cache and v_cache must be contiguous (written through a view)"
        )
    slots = slot_mapping.long()  # (N,)
    k_cache.view(num_pages * page_size, num_kv_heads, head_dim).index_copy_(
        0, slots, k.to(k_cache.dtype)
    )
    v_cache.view(num_pages * page_size, num_kv_heads, head_dim).index_copy_(
        0, slots, v.to(v_cache.dtype)
    )


def update_page_summaries(
    k_cache: Tensor, summary: PageSummary, page_ids: Tensor, fill_counts: Tensor
) -> None:
    """Recompute the summary rows of physical `page_ids` (P,) from their first `fill_counts` (P,)
    tokens (1..PAGE_SIZE). Recomputing the whole page (rather than folding in the new token) keeps
    min/max exact and costs one page read per sequence per decode step."""
    page_size = k_cache.shape[1]
    if page_ids.dim() != 1 or fill_counts.shape != page_ids.shape:
        raise ValueError(
            f"update_page_summaries: page_ids and fill_counts must both be (P,); got "
            f"{tuple(page_ids.shape)} and {tuple(fill_counts.shape)}"
        )
    if page_ids.numel() == 0:
        return
    pages = page_ids.long()  # (P,)
    keys = k_cache.index_select(0, pages).float()  # (P, PAGE_SIZE, H_kv, D)
    offsets = torch.arange(page_size, device=k_cache.device)  # (PAGE_SIZE,)
    valid = (offsets[None, :] < fill_counts.to(k_cache.device)[:, None])[..., None, None]
    counts = fill_counts.to(device=k_cache.device, dtype=torch.float32).clamp(min=1)  # (P,)
    if summary.k_mean is not None:
        k_sum = torch.where(valid, keys, 0.0).sum(dim=1)  # (P, H_kv, D) fp32
        mean = k_sum / counts[:, None, None]  # rounded once, to the table's dtype
        summary.k_mean.index_copy_(0, pages, mean.to(summary.k_mean.dtype))
    if summary.k_min is not None:
        k_min = torch.where(valid, keys, float("inf")).amin(dim=1)  # (P, H_kv, D)
        summary.k_min.index_copy_(0, pages, k_min.to(summary.k_min.dtype))
    if summary.k_max is not None:
        k_max = torch.where(valid, keys, float("-inf")).amax(dim=1)  # (P, H_kv, D)
        summary.k_max.index_copy_(0, pages, k_max.to(summary.k_max.dtype))


def _check_cache_pair(k_cache: Tensor, v_cache: Tensor) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(
            "k_cache and v_cache must both be (num_pages, PAGE_SIZE, H_kv, D) with the same dtype; "
            f"got {tuple(k_cache.shape)} {k_cache.dtype} and {tuple(v_cache.shape)} {v_cache.dtype}"
        )
