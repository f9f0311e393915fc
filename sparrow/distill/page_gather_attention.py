"""Page-gathering sparse attention for teacher-forced training, in O(T x budget) memory.

One sparse layer of the sparse policy over a whole rollout: every query position t reads only
the pages the engine's decode step for the token at t + 1 read (page_selection.py states the
rule). Queries are taken in chunks of C positions. Per chunk, without gradient: the selection
of each query (sparse queries: their own pages; dense ones, whose budget covers their context,
such as the prompt: every page up to theirs), the union of those pages per (sequence, KV head),
and the key mask of each query over the union's keys (its own pages, keys after t masked). With
gradient: the union's pages are gathered from K and V and one fused SDPA runs over them, the
GQA group's query heads stacked as rows (K/V read once per group).

Each chunk runs under activation checkpointing: the forward keeps only its inputs (the chunk's
queries, the shared K/V and the selected page ids, int32, budget / PAGE per query and KV head),
and the backward re-selects the union, re-gathers it and recomputes the chunk. So no (T, T) mask,
score matrix or gathered K/V outlives its chunk: memory is O(T x budget) plus one chunk's
working set, which `query_chunk` bounds. Torch ops only, the same on CPU and GPU; fp32 (the
engine's decode is fp32). The masked form (attention_reference.py) computes the same function in
O(T^2) memory; the tests hold the two equal.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from sparrow.distill.page_selection import page_summary_tables, select_query_pages
from sparrow.rollout.paged_attention import SparseAttentionConfig


@dataclass
class _Chunk:
    """The selection of one chunk of queries, all the backward pass needs to redo it."""

    start: int
    end: int
    sparse: Tensor  # (B, C) bool: the query reads selected pages (budget < pages)
    pages: Tensor | None  # (B, H_kv, C, S) int32 pages of the sparse queries; None: no such query
    num_selected: Tensor | None  # (B, C) pages in use of the S slots


@torch.no_grad()
def _chunk_keys(part: _Chunk, num_pages: int, page_size: int) -> tuple[Tensor, Tensor]:
    """The pages any query of the chunk reads, per (sequence, KV head), and who reads what.

    Returns union (B, H_kv, U) int64, ascending (padded with unread pages), and the key mask
    (B, H_kv, C, U * PAGE) bool: the query reads the key's page and the key is not after it.
    """
    batch, size = part.sparse.shape
    device = part.sparse.device
    positions = torch.arange(part.start, part.end, device=device)  # (C,)
    pages = torch.arange(num_pages, device=device)  # (NP,)
    # Dense queries read every page up to their own.
    own_page = (positions // page_size)[:, None]  # (C, 1)
    chosen = (~part.sparse[:, None, :, None]) & (pages <= own_page)  # (B, 1, C, NP)
    if part.pages is not None and part.num_selected is not None:  # set together
        num_kv_heads, slots = part.pages.shape[1], part.pages.shape[-1]
        used = torch.arange(slots, device=device) < part.num_selected[:, None, :, None]
        used = used & part.sparse[:, None, :, None]  # (B, 1, C, S) dense queries: page 0 only
        picked = torch.zeros(
            batch, num_kv_heads, size, num_pages + 1, dtype=torch.bool, device=device
        )
        picked.scatter_(3, torch.where(used, part.pages.long(), num_pages), True)
        chosen = chosen | picked[..., :num_pages]  # (B, H_kv, C, NP)
    read = chosen.any(dim=2)  # (B, H_kv, NP)
    width = int(read.sum(-1).max())
    # A stable sort of "not read" puts the read pages first, in ascending order.
    union = torch.sort((~read).to(torch.uint8), dim=-1, stable=True).indices[..., :width]
    reads = chosen.expand(-1, union.shape[1], -1, -1).gather(
        3, union[:, :, None].expand(-1, -1, size, -1)
    )  # (B, H_kv, C, U)
    key_pos = union[..., None] * page_size + torch.arange(page_size, device=device)  # (B,H,U,P)
    causal = key_pos.flatten(2)[:, :, None, :] <= positions[:, None]  # (B, H_kv, C, U * PAGE)
    return union, reads.repeat_interleave(page_size, dim=-1) & causal


def _chunk_attention(
    q_rows: Tensor, k_rows: Tensor, v_rows: Tensor, part: _Chunk, num_pages: int, scale: float
) -> Tensor:
    """q_rows (B, H_kv, G * C, D) the chunk's queries, group-major; k_rows/v_rows
    (B * H_kv * NP, PAGE * D) the paged K/V -> (B, H_kv, G * C, D)."""
    batch, num_kv_heads, rows, head_dim = q_rows.shape
    page_size = k_rows.shape[1] // head_dim
    group = rows // (part.end - part.start)
    union, mask = _chunk_keys(part, num_pages, page_size)  # (B, H_kv, U), (B, H_kv, C, U*PAGE)
    base = torch.arange(batch * num_kv_heads, device=union.device).view(batch, num_kv_heads, 1)
    index = (base * num_pages + union).reshape(-1)  # (B * H_kv * U,) rows of the paged table
    shape = (batch, num_kv_heads, union.shape[-1] * page_size, head_dim)
    keys = k_rows.index_select(0, index).view(shape)  # (B, H_kv, U * PAGE, D)
    values = v_rows.index_select(0, index).view(shape)
    mask = mask.repeat(1, 1, group, 1)  # (B, H_kv, G * C, U * PAGE), the same for the group
    return F.scaled_dot_product_attention(q_rows, keys, values, attn_mask=mask, scale=scale)


def page_gather_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    budgets: Tensor,
    attn: SparseAttentionConfig,
    scale: float,
    chunk: int,
) -> Tensor:
    """One sparse layer: q (B, H_q, T_q, D) the last T_q of the T positions (the first T - T_q
    are a cached prefix, keys only), k/v (B, H_kv, T, D) fp32 post-RoPE, budgets (B, T) pages
    per query position (`query_budgets`), `chunk` query positions at a time -> (B, H_q, T_q, D)."""
    batch, num_q_heads, num_queries, head_dim = q.shape
    num_kv_heads, seq_len, ps = k.shape[1], k.shape[2], attn.page_size
    offset = seq_len - num_queries  # position of the first query
    group, num_pages = num_q_heads // num_kv_heads, -(-seq_len // ps)
    tables = page_summary_tables(k.detach(), attn)  # (B, H_kv, D, NP) each
    pad = (0, 0, 0, num_pages * ps - seq_len)
    k_rows = F.pad(k, pad).reshape(-1, ps * head_dim)  # (B * H_kv * NP, PAGE * D)
    v_rows = F.pad(v, pad).reshape(-1, ps * head_dim)
    q_groups = q.view(batch, num_kv_heads, group, num_queries, head_dim)  # (B, H_kv, G, T_q, D)
    outputs = []
    for start in range(offset, seq_len, chunk):
        end = min(start + chunk, seq_len)
        positions = torch.arange(start, end, device=q.device)  # (C,)
        rows = slice(start - offset, end - offset)  # the chunk's queries in q
        part = _Chunk(start, end, budgets[:, start:end] < positions // ps + 1, None, None)
        if part.sparse.any():
            selected = select_query_pages(
                q[:, :, rows].detach(), tables, positions, budgets[:, start:end], attn
            )
            slots = selected.logical_pages.shape[-1]
            pages = selected.logical_pages.view(batch, end - start, num_kv_heads, slots)
            part.pages = pages.transpose(1, 2)  # (B, H_kv, C, S)
            part.num_selected = selected.num_selected.view(batch, end - start)
        q_rows = q_groups[:, :, :, rows].flatten(2, 3)  # (B, H_kv, G * C, D)
        out = checkpoint(
            _chunk_attention, q_rows, k_rows, v_rows, part, num_pages, scale, use_reentrant=False
        )  # (B, H_kv, G * C, D)
        outputs.append(out.view(batch, num_kv_heads, group, end - start, head_dim))
    return torch.cat(outputs, dim=3).view(batch, num_q_heads, num_queries, head_dim)


def query_chunk(
    budgets: Tensor, page_size: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
    max_elements: int,
) -> int:  # fmt: skip
    """Query positions per chunk so that one chunk's largest tensor (the score rows over its
    union of pages, at most every key before it, or the gathered K/V) holds at most
    `max_elements` elements. budgets: (B, T) pages per query."""
    batch, seq_len = budgets.shape
    per_query = batch * max(num_q_heads, num_kv_heads * head_dim // page_size) * seq_len
    return max(1, min(seq_len, max_elements // per_query))
