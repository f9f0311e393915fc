"""Fixtures for the kernel tests: random paged KV batches written through the real write path."""

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from sparrow.kernels import PageSummary, update_page_summaries, write_kv


@dataclass
class PagedBatch:
    q: torch.Tensor  # (B, H_q, D)
    k_cache: torch.Tensor  # (num_pages, PAGE_SIZE, H_kv, D)
    v_cache: torch.Tensor  # (num_pages, PAGE_SIZE, H_kv, D)
    page_table: torch.Tensor  # (B, max_pages) int32, shuffled ids, unused columns -1
    seq_lens: torch.Tensor  # (B,) int32
    summary: PageSummary
    page_size: int


def build_paged_batch(
    seq_lens: list[int],
    num_kv_heads: int,
    group: int,
    head_dim: int,
    *,
    page_size: int = 16,
    dtype: torch.dtype = torch.float32,
    spare_pages: int = 3,
    extra_columns: int = 2,
    strided_table: bool = False,
    seed: int = 0,
    device: str = "cpu",
) -> PagedBatch:
    """Sequences get shuffled (non-contiguous) physical pages out of a pool with spare pages; the
    page table has unused columns set to -1, and can be a strided view (`strided_table`)."""
    gen = torch.Generator().manual_seed(seed)
    pages_per_seq = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(pages_per_seq) + spare_pages
    max_pages = max(pages_per_seq) + extra_columns
    # NaN everywhere no token is written: a kernel that reads past seq_len or an unused page
    # produces NaN instead of a plausible wrong answer.
    k_cache = torch.full((num_pages, page_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    summary = PageSummary.empty(num_pages, num_kv_heads, head_dim, "cpu")
    order = torch.randperm(num_pages, generator=gen)
    table = torch.full((len(seq_lens), max_pages), -1, dtype=torch.int32)
    used = 0
    for b, (seq_len, n) in enumerate(zip(seq_lens, pages_per_seq, strict=True)):
        table[b, :n] = order[used : used + n].to(torch.int32)
        used += n
        positions = torch.arange(seq_len)
        slots = table[b, positions // page_size].long() * page_size + positions % page_size
        keys = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen)
        # A per-page offset gives pages distinct centroids, so the top-k has no near-ties.
        keys += torch.randn(n, 1, head_dim, generator=gen).repeat_interleave(page_size, 0)[:seq_len]
        write_kv(k_cache, v_cache, keys, torch.randn(keys.shape, generator=gen), slots)
        fill = torch.full((n,), page_size)
        fill[-1] = seq_len - (n - 1) * page_size
        update_page_summaries(k_cache, summary, table[b, :n], fill)
    q = torch.randn(len(seq_lens), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    if device != "cpu":
        summary = PageSummary(
            *(t.to(device) for t in (summary.k_mean, summary.k_min, summary.k_max))
        )
        q, k_cache, v_cache, lens = (t.to(device) for t in (q, k_cache, v_cache, lens))
        table = table.to(device)
    if strided_table:
        table = torch.stack([table, table], dim=-1)[..., 0]  # same values, column stride 2
    return PagedBatch(q, k_cache, v_cache, table, lens, summary, page_size)


@pytest.fixture
def paged_batch():
    return build_paged_batch


def poison_unselected_pages(batch: PagedBatch, logical_pages, num_selected) -> None:
    """Overwrite with NaN every (page, KV head) slice that the selection does not keep, so any
    read of an unselected page shows up as NaN in the output."""
    for b in range(batch.q.shape[0]):
        n = -(-int(batch.seq_lens[b]) // batch.page_size)
        for h in range(batch.k_cache.shape[2]):
            kept = set(logical_pages[b, h, : int(num_selected[b])].tolist())
            for p in set(range(n)) - kept:
                batch.k_cache[int(batch.page_table[b, p]), :, h] = float("nan")
                batch.v_cache[int(batch.page_table[b, p]), :, h] = float("nan")


@pytest.fixture
def poison_unselected():
    return poison_unselected_pages


def sdpa_dense(batch):
    """Dense attention with torch SDPA over each sequence's keys laid out contiguously."""
    page_size = batch.page_size
    max_len = int(batch.seq_lens.max())
    pos = torch.arange(max_len)  # (T,)
    phys = (
        batch.page_table.long()
        .clamp(min=0)
        .gather(1, (pos // page_size).expand(len(batch.seq_lens), -1))
    )
    keys = batch.k_cache[phys, pos % page_size]  # (B, T, H_kv, D)
    values = batch.v_cache[phys, pos % page_size]  # (B, T, H_kv, D)
    valid = pos[None, :] < batch.seq_lens[:, None].long()  # (B, T)
    keys = torch.where(valid[..., None, None], keys, 0.0).transpose(1, 2)  # (B, H_kv, T, D)
    values = torch.where(valid[..., None, None], values, 0.0).transpose(1, 2)
    q = batch.q[:, :, None]  # (B, H_q, 1, D)
    out = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=valid[:, None, None, :], enable_gqa=True
    )  # (B, H_q, 1, D)
    return out[:, :, 0]


@pytest.fixture(name="sdpa_dense")
def sdpa_dense_fixture():
    return sdpa_dense


def close_to_magnitude(out, expected, rel):
    """Assert |out - expected| <= rel * max|expected| per (sequence, head): a bf16/fp16 output is
    rounded at its own scale, so the bound follows it. `rel` 2^-6 for bf16 fails attention that
    dropped a tenth of its tokens (test_bf16_tolerance.py)."""
    scale = expected.abs().amax(dim=-1, keepdim=True)  # (B, H_q, 1)
    err = (out.double() - expected.double()).abs()
    assert (err <= rel * scale).all(), f"max error / scale {(err / scale).max():.3g} > {rel}"


@pytest.fixture(name="close_to_magnitude")
def close_to_magnitude_fixture():
    return close_to_magnitude


def attention_dropping(batch, every: int = 10):
    """Dense decode attention in float64 that leaves out every `every`-th token (0, 10, ...)."""
    page_size, num_kv_heads = batch.page_size, batch.k_cache.shape[2]
    group = batch.q.shape[1] // num_kv_heads
    out = torch.empty(batch.q.shape, dtype=torch.float64)
    for b, n in enumerate(batch.seq_lens.tolist()):
        kept = torch.tensor([t for t in range(n) if t % every])  # (T,)
        phys = batch.page_table[b].long()[kept // page_size]  # (T,)
        keys = batch.k_cache[phys, kept % page_size].double().transpose(0, 1)  # (H_kv, T, D)
        values = batch.v_cache[phys, kept % page_size].double().transpose(0, 1)
        q = batch.q[b].double().view(num_kv_heads, group, 1, -1)  # (H_kv, G, 1, D)
        o = F.scaled_dot_product_attention(q, keys[:, None], values[:, None])  # (H_kv, G, 1, D)
        out[b] = o.reshape(out.shape[1:])
    return out


@pytest.fixture(name="attention_dropping")
def attention_dropping_fixture():
    return attention_dropping
