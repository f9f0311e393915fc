"""The masked form of the training-time sparse attention, kept as the reference only.

This was the training path before the page-gathering attention (page_gather_attention.py): one
boolean (B, H_kv, T, T) key mask per sparse layer from `selected_key_mask`, then one fp32 masked
SDPA with the GQA group's query heads stacked as rows. Its memory and time grow as T^2, so it is
not used for training; the tests compare the gathering path against it (outputs and gradients)
and the memory/time benchmark (`python -m sparrow.bench.distill_attention`) measures both.
`register_reference_attention` makes it selectable by name on an HF model, exactly as the
training path is, so a whole DistillSparse update can run on either.
"""

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface

from sparrow.distill.sparse_attention import SparseForwardMetadata, hf_attention
from sparrow.kernels import PageSummary, select_from_scores, update_page_summaries
from sparrow.rollout.paged_attention import SparseAttentionConfig

REFERENCE_ATTENTION_NAME = "sparrow_block_sparse_masked_reference"


@torch.no_grad()
def page_scores(q: Tensor, keys: Tensor, attn: SparseAttentionConfig) -> Tensor:
    """Score of every page for every query, per KV head, as the engine computes it.

    q: (B, H_q, T_q, D) post-RoPE queries of the last T_q positions; keys: (B, H_kv, T, D)
    post-RoPE keys. Returns (B, T_q, H_kv, NP) fp32 with NP = ceil(T / PAGE); entries for pages
    not wholly before the query are meaningless (`select_from_scores` never takes them).
    """
    batch, num_q_heads, num_queries, head_dim = q.shape
    num_kv_heads, seq_len = keys.shape[1], keys.shape[2]
    group = num_q_heads // num_kv_heads
    ps = attn.page_size
    num_pages = -(-seq_len // ps)
    padded = F.pad(keys, (0, 0, 0, num_pages * ps - seq_len))  # (B, H_kv, NP * PAGE, D)
    # The engine's cache layout (pages, PAGE, H_kv, D), so its own summary code applies unchanged.
    cache = padded.view(batch, num_kv_heads, num_pages, ps, head_dim).permute(0, 2, 3, 1, 4)
    cache = cache.reshape(batch * num_pages, ps, num_kv_heads, head_dim).contiguous()
    summary = PageSummary.empty(batch * num_pages, num_kv_heads, head_dim, q.device)
    fills = torch.full((batch * num_pages,), ps, dtype=torch.int64, device=q.device)
    update_page_summaries(cache, summary, torch.arange(batch * num_pages, device=q.device), fills)

    def per_head(table: Tensor | None) -> Tensor:  # (B, H_kv, 1, D, NP)
        assert table is not None, "a summary holds the tables of its score"
        return table.view(batch, num_pages, num_kv_heads, head_dim).permute(0, 2, 3, 1)[:, :, None]

    q_groups = q.float().reshape(batch, num_kv_heads, group, num_queries, head_dim)
    if attn.score == "centroid":  # q_groups: (B, H_kv, G, T_q, D)
        q_mean = q_groups.mean(dim=2, keepdim=True)  # (B, H_kv, 1, T_q, D)
        scores = torch.matmul(q_mean, per_head(summary.k_mean)).squeeze(2)  # (B, H_kv, T_q, NP)
    elif attn.score == "quest":
        bound = torch.matmul(q_groups.clamp(min=0), per_head(summary.k_max))  # (B,H_kv,G,T_q,NP)
        bound += torch.matmul(q_groups.clamp(max=0), per_head(summary.k_min))
        scores = bound.amax(dim=2)  # (B, H_kv, T_q, NP)
    else:
        raise ValueError(f"score must be 'quest' or 'centroid', got {attn.score!r}")
    return scores.transpose(1, 2)  # (B, T_q, H_kv, NP)


@torch.no_grad()
def selected_key_mask(q: Tensor, keys: Tensor, meta: SparseForwardMetadata) -> Tensor:
    """Keys each (sequence, KV head, query) may attend to in a sparse layer.

    q: (B, H_q, T_q, D) the queries of the last T_q positions (the first T - T_q are a cached
    prefix, keys only, as in `hf_attention`); keys: (B, H_kv, T, D); meta.query_budgets: (B, T).
    Returns (B, H_kv, T_q, T) bool, causal.
    """
    attn = meta.attn
    batch, num_kv_heads, seq_len, _ = keys.shape
    num_queries = q.shape[2]
    scores = page_scores(q, keys, attn)  # (B, T_q, H_kv, NP)
    num_pages = scores.shape[-1]
    keys_at = torch.arange(seq_len, device=q.device)  # (T,)
    queries_at = keys_at[seq_len - num_queries :]  # (T_q,)
    selected = select_from_scores(
        scores.reshape(batch * num_queries, num_kv_heads, num_pages),
        (queries_at + 1).repeat(batch),  # (B * T_q,) tokens in the cache, the query's own too
        meta.query_budgets[:, seq_len - num_queries :].reshape(-1),  # (B * T_q,)
        page_size=attn.page_size,
        num_sink=attn.num_sink,
        num_recent=attn.num_recent,
    )
    slots = selected.logical_pages.long()  # (B * T_q, H_kv, S)
    in_use = torch.arange(slots.shape[-1], device=q.device) < selected.num_selected[:, None, None]
    # Padding slots go to an extra column that is dropped.
    chosen = torch.zeros(
        batch * num_queries, num_kv_heads, num_pages + 1, dtype=torch.bool, device=q.device
    )
    chosen.scatter_(2, torch.where(in_use, slots, num_pages), True)
    chosen = chosen[..., :num_pages].view(batch, num_queries, num_kv_heads, num_pages)
    key_page = keys_at // attn.page_size  # (T,)
    keep = chosen.transpose(1, 2)[..., key_page]  # (B, H_kv, T_q, T)
    return keep & (keys_at[None, :] <= queries_at[:, None])


def masked_sparse_attention(
    query: Tensor, key: Tensor, value: Tensor, scaling: float, meta: SparseForwardMetadata
) -> Tensor:
    """One sparse layer by mask: query (B, H_q, T_q, D) of the last T_q positions, key/value
    (B, H_kv, T, D) -> (B, H_q, T_q, D) fp32; GQA without repeating K/V (the group's query heads
    stacked as rows)."""
    batch, num_q_heads, num_queries, head_dim = query.shape
    num_kv_heads, seq_len = key.shape[1], key.shape[2]
    group = num_q_heads // num_kv_heads
    keep = selected_key_mask(query, key, meta)  # (B, H_kv, T_q, T)
    rows = keep[:, :, None].expand(batch, num_kv_heads, group, num_queries, seq_len)
    rows = rows.reshape(batch, num_kv_heads, group * num_queries, seq_len)  # (B,H_kv,G*T_q,T)
    q_rows = query.float().reshape(batch, num_kv_heads, group * num_queries, head_dim)
    out = F.scaled_dot_product_attention(
        q_rows, key.float(), value.float(), attn_mask=rows, scale=scaling
    )  # (B, H_kv, G*T_q, D)
    return out.view(batch, num_q_heads, num_queries, head_dim)


masked_block_sparse_attention = hf_attention(REFERENCE_ATTENTION_NAME, masked_sparse_attention)


def register_reference_attention() -> str:
    """Make the reference attention available to HF models by name (idempotent)."""
    AttentionInterface.register(REFERENCE_ATTENTION_NAME, masked_block_sparse_attention)
    return REFERENCE_ATTENTION_NAME
