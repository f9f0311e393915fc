"""Paged KV cache layout, KV writes and per-page key summaries.

Layout (one layer): `k_cache`, `v_cache` are (num_pages, PAGE_SIZE, H_kv, D); a sequence's page
table maps its logical pages 0..n-1 to physical page ids, and token t lives at logical page
t // PAGE_SIZE, offset t % PAGE_SIZE. Each physical page carries a `PageSummary` row: the centroid
of its valid keys (the Sparrow paper's page score) and their channel-wise min/max (Quest's upper
bound on q.k, arXiv 2406.10774). Plain torch index ops: they run on CPU and CUDA alike and read
only the pages they touch, so no Triton kernel is needed here.
"""

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class PageSummary:
    """Per-layer key summaries of every physical page; fp32 so that scoring is exact enough."""

    k_mean: Tensor  # (num_pages, H_kv, D) centroid of the page's valid keys
    k_min: Tensor  # (num_pages, H_kv, D) channel-wise min of valid keys
    k_max: Tensor  # (num_pages, H_kv, D) channel-wise max of valid keys

    @staticmethod
    def empty(
        num_pages: int, num_kv_heads: int, head_dim: int, device: torch.device | str
    ) -> "PageSummary":
        shape = (num_pages, num_kv_heads, head_dim)
        return PageSummary(
            k_mean=torch.zeros(shape, dtype=torch.float32, device=device),
            k_min=torch.zeros(shape, dtype=torch.float32, device=device),
            k_max=torch.zeros(shape, dtype=torch.float32, device=device),
        )


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
    k_sum = torch.where(valid, keys, 0.0).sum(dim=1)  # (P, H_kv, D)
    summary.k_mean.index_copy_(0, pages, k_sum / counts[:, None, None])
    summary.k_min.index_copy_(0, pages, torch.where(valid, keys, float("inf")).amin(dim=1))
    summary.k_max.index_copy_(0, pages, torch.where(valid, keys, float("-inf")).amax(dim=1))


def _check_cache_pair(k_cache: Tensor, v_cache: Tensor) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(
            "k_cache and v_cache must both be (num_pages, PAGE_SIZE, H_kv, D) with the same dtype; "
            f"got {tuple(k_cache.shape)} {k_cache.dtype} and {tuple(v_cache.shape)} {v_cache.dtype}"
        )
