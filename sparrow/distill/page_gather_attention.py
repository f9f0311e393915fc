"""Page-gathering sparse attention for teacher-forced training, in O(T x budget) memory.

One sparse layer of the sparse policy over a whole rollout: every query position t reads only
the pages the engine's decode step for the token at t + 1 read (page_selection.py states the
rule). Queries are taken in chunks of C positions. Per chunk:
- the pages each query selected are gathered from K and V (page granularity, per KV head), and
  the query attends over them, keys past t masked (the partial page holding t);
- queries whose budget covers their whole context (the prompt, early completion steps, the
  last position) attend causally to keys [0, t] instead, without any gather;
- softmax is the stable log-sum-exp form; the output and the log-sum-exp per query row are kept.
The backward pass re-gathers each chunk's pages and recomputes the probabilities from the kept
log-sum-exp (as flash attention does), so what outlives a chunk is q, k, v, the output, the
log-sum-exp and the selected page ids (int32, budget / PAGE per query and KV head): no (T, T)
mask and no (T, budget) gathered K/V. GQA reads each KV head's gather once for the whole group.

Torch ops only, the same on CPU and GPU; fp32 throughout (the engine's decode is fp32). The
masked form (attention_reference.py) computes the same function in O(T^2) memory; the tests
hold the two equal.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from sparrow.distill.page_selection import page_summary_tables, select_query_pages
from sparrow.rollout.paged_attention import SparseAttentionConfig


@dataclass
class _Chunk:
    """What the backward pass needs to redo one chunk of queries."""

    start: int
    end: int
    sparse: Tensor  # (B, C) bool: the query reads selected pages (budget < pages)
    pages: Tensor | None  # (B, H_kv, C, S) int32 logical pages per query; None: no sparse query
    num_selected: Tensor | None  # (B, C) pages in use of the S slots


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """q (..., M, D), k/v (..., N, D), mask broadcastable to (..., M, N) -> (..., M, D) output
    and (..., M) log-sum-exp of the masked scores. Every row must keep at least one key."""
    s = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).masked_fill_(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (..., M)
    p = s.sub_(lse[..., None]).exp_()  # (..., M, N)
    return torch.matmul(p, v), lse


def _attend_backward(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, lse: Tensor, dout: Tensor,
    delta: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Gradients of `_attend` w.r.t. q, k, v from the saved lse (..., M), the output gradient
    dout (..., M, D) and delta = rowsum(dout * out) (..., M). Rows that `_attend` did not
    produce (the other path's queries) carry lse = +inf and dout = 0: they contribute nothing."""
    s = torch.matmul(q, k.transpose(-1, -2)).mul_(scale).masked_fill_(~mask, float("-inf"))
    p = s.sub_(lse[..., None]).exp_()  # (..., M, N)
    dv = torch.matmul(p.transpose(-1, -2), dout)  # (..., N, D)
    ds = torch.matmul(dout, v.transpose(-1, -2)).sub_(delta[..., None]).mul_(p)  # (..., M, N)
    dq = torch.matmul(ds, k).mul_(scale)  # (..., M, D)
    dk = torch.matmul(ds.transpose(-1, -2), q).mul_(scale)  # (..., N, D)
    return dq, dk, dv


def _page_rows(pages: Tensor, num_pages: int) -> Tensor:
    """(B, H_kv, C, S) logical pages -> (B * H_kv * C * S,) rows of the paged K/V table
    (B * H_kv * NP, PAGE * D)."""
    batch, num_kv_heads = pages.shape[:2]
    base = torch.arange(batch * num_kv_heads, device=pages.device).view(batch, num_kv_heads, 1, 1)
    return (base * num_pages + pages.long()).reshape(-1)


def _selected_keys_mask(chunk: _Chunk, page_size: int) -> Tensor:
    """(B, H_kv, C, 1, S * PAGE) bool: the gathered key is in a used slot and not after t."""
    batch, num_kv_heads, size, slots = chunk.pages.shape
    device = chunk.pages.device
    positions = torch.arange(chunk.start, chunk.end, device=device)  # (C,)
    used = torch.arange(slots, device=device) < chunk.num_selected[:, None, :, None]  # (B,1,C,S)
    key_pos = chunk.pages.long()[..., None] * page_size + torch.arange(page_size, device=device)
    valid = used[..., None] & (key_pos <= positions[:, None, None])  # (B, H_kv, C, S, PAGE)
    return valid.view(batch, num_kv_heads, size, 1, slots * page_size)


def _dense_queries(chunk: _Chunk, row: int) -> tuple[Tensor, Tensor] | None:
    """Offsets within the chunk (n,) and positions (n,) of row's dense queries; None if none."""
    offsets = (~chunk.sparse[row]).nonzero().squeeze(1)  # (n,)
    return None if offsets.numel() == 0 else (offsets, offsets + chunk.start)


def _causal_mask(positions: Tensor, group: int) -> Tensor:
    """(G * n, t_max + 1) bool: the query at each position sees keys up to it; G copies."""
    keys = torch.arange(int(positions[-1]) + 1, device=positions.device)  # ascending positions
    return (keys[None, :] <= positions[:, None]).repeat(group, 1)


class PageGatherAttention(torch.autograd.Function):
    """(q (B, H_q, T, D), k, v (B, H_kv, T, D), budgets (B, T), attn, scale, chunk) ->
    (B, H_q, T, D); gradients for q, k and v."""

    @staticmethod
    def forward(ctx, q, k, v, budgets, attn: SparseAttentionConfig, scale: float, chunk: int):
        batch, num_q_heads, seq_len, head_dim = q.shape
        num_kv_heads, ps = k.shape[1], attn.page_size
        group, num_pages = num_q_heads // num_kv_heads, -(-seq_len // ps)
        tables = page_summary_tables(k, attn)  # (B, H_kv, D, NP) each
        pad = (0, 0, 0, num_pages * ps - seq_len)
        k_pad, v_pad = F.pad(k, pad), F.pad(v, pad)  # (B, H_kv, NP * PAGE, D)
        k_rows = k_pad.view(-1, ps * head_dim)  # (B * H_kv * NP, PAGE * D)
        v_rows = v_pad.view(-1, ps * head_dim)
        q_groups = q.view(batch, num_kv_heads, group, seq_len, head_dim)  # (B, H_kv, G, T, D)
        out = torch.empty_like(q_groups)  # (B, H_kv, G, T, D)
        lse = q.new_empty(batch, num_kv_heads, group, seq_len)  # (B, H_kv, G, T)
        chunks = []
        for start in range(0, seq_len, chunk):
            end = min(start + chunk, seq_len)
            positions = torch.arange(start, end, device=q.device)  # (C,)
            part = _Chunk(start, end, budgets[:, start:end] < positions // ps + 1, None, None)
            if part.sparse.any():
                selected = select_query_pages(
                    q[:, :, start:end], tables, positions, budgets[:, start:end], attn
                )
                slots = selected.logical_pages.shape[-1]
                part.pages = selected.logical_pages.view(batch, end - start, num_kv_heads, slots)
                part.pages = part.pages.transpose(1, 2)  # (B, H_kv, C, S)
                part.num_selected = selected.num_selected.view(batch, end - start)
                rows = _page_rows(part.pages, num_pages)
                shape = (batch, num_kv_heads, end - start, slots * ps, head_dim)
                keys = k_rows.index_select(0, rows).view(shape)  # (B, H_kv, C, S * PAGE, D)
                values = v_rows.index_select(0, rows).view(shape)
                q_chunk = q_groups[:, :, :, start:end].transpose(2, 3)  # (B, H_kv, C, G, D)
                o, m = _attend(q_chunk, keys, values, _selected_keys_mask(part, ps), scale)
                out[:, :, :, start:end] = o.transpose(2, 3)  # (B, H_kv, G, C, D)
                lse[:, :, :, start:end] = m.transpose(2, 3)  # (B, H_kv, G, C)
            for b in range(batch):  # dense queries: causal over keys [0, t], no gather
                dense = _dense_queries(part, b)
                if dense is None:
                    continue
                offsets, pos = dense
                cols = offsets + start  # (n,)
                q_rows = q_groups[b][:, :, cols].flatten(1, 2)  # (H_kv, G * n, D)
                keys, values = k_pad[b, :, : int(pos[-1]) + 1], v_pad[b, :, : int(pos[-1]) + 1]
                o, m = _attend(q_rows, keys, values, _causal_mask(pos, group), scale)
                out[b][:, :, cols] = o.view(num_kv_heads, group, -1, head_dim)
                lse[b][:, :, cols] = m.view(num_kv_heads, group, -1)
            chunks.append(part)
        ctx.save_for_backward(q, k_pad, v_pad, out, lse)
        ctx.chunks, ctx.page_size, ctx.scale, ctx.seq_len = chunks, ps, scale, seq_len
        return out.view(batch, num_q_heads, seq_len, head_dim)

    @staticmethod
    def backward(ctx, dout):
        q, k_pad, v_pad, out, lse = ctx.saved_tensors
        ps, scale, seq_len = ctx.page_size, ctx.scale, ctx.seq_len
        batch, num_kv_heads, group, _, head_dim = out.shape
        num_pages = k_pad.shape[2] // ps
        dout = dout.reshape(out.shape)  # (B, H_kv, G, T, D)
        delta = (dout * out).sum(-1)  # (B, H_kv, G, T)
        q_groups = q.view(out.shape)
        dq = torch.zeros_like(q_groups)  # (B, H_kv, G, T, D)
        dk, dv = torch.zeros_like(k_pad), torch.zeros_like(v_pad)  # (B, H_kv, NP * PAGE, D)
        k_rows, v_rows = k_pad.view(-1, ps * head_dim), v_pad.view(-1, ps * head_dim)
        dk_rows, dv_rows = dk.view(-1, ps * head_dim), dv.view(-1, ps * head_dim)
        for part in ctx.chunks:
            cols = slice(part.start, part.end)
            if part.pages is not None:
                # Only the sparse queries' rows: the others get lse = +inf and zero gradient.
                sparse = part.sparse[:, None, :, None]  # (B, 1, C, 1)
                lse_c = lse[:, :, :, cols].transpose(2, 3).masked_fill(~sparse, float("inf"))
                dout_c = dout[:, :, :, cols].transpose(2, 3) * sparse[..., None]  # (B,H_kv,C,G,D)
                delta_c = delta[:, :, :, cols].transpose(2, 3) * sparse  # (B, H_kv, C, G)
                rows = _page_rows(part.pages, num_pages)
                slots = part.pages.shape[-1]
                shape = (batch, num_kv_heads, part.end - part.start, slots * ps, head_dim)
                keys = k_rows.index_select(0, rows).view(shape)  # (B, H_kv, C, S * PAGE, D)
                values = v_rows.index_select(0, rows).view(shape)
                q_chunk = q_groups[:, :, :, cols].transpose(2, 3)  # (B, H_kv, C, G, D)
                mask = _selected_keys_mask(part, ps)  # (B, H_kv, C, 1, S * PAGE)
                dq_c, dk_c, dv_c = _attend_backward(
                    q_chunk, keys, values, mask, scale, lse_c, dout_c, delta_c
                )
                dq[:, :, :, cols] += dq_c.transpose(2, 3)
                dk_rows.index_add_(0, rows, dk_c.reshape(-1, ps * head_dim))
                dv_rows.index_add_(0, rows, dv_c.reshape(-1, ps * head_dim))
            for b in range(batch):
                dense = _dense_queries(part, b)
                if dense is None:
                    continue
                offsets, pos = dense
                idx = offsets + part.start  # (n,)
                length = int(pos[-1]) + 1
                # (H_kv, G, T, ...) -> (H_kv, G * n, ...): the group's rows of these queries
                q_b, lse_b, dout_b, delta_b = (
                    x[b][:, :, idx].flatten(1, 2) for x in (q_groups, lse, dout, delta)
                )
                dq_b, dk_b, dv_b = _attend_backward(
                    q_b, k_pad[b, :, :length], v_pad[b, :, :length], _causal_mask(pos, group),
                    scale, lse_b, dout_b, delta_b,
                )  # fmt: skip
                dq[b][:, :, idx] += dq_b.view(num_kv_heads, group, -1, head_dim)
                dk[b, :, :length] += dk_b
                dv[b, :, :length] += dv_b
        dq = dq.view(q.shape)
        return dq, dk[:, :, :seq_len], dv[:, :, :seq_len], None, None, None, None


def page_gather_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    budgets: Tensor,
    attn: SparseAttentionConfig,
    scale: float,
    chunk: int,
) -> Tensor:
    """One sparse layer: q (B, H_q, T, D), k/v (B, H_kv, T, D) fp32 post-RoPE, budgets (B, T)
    pages per query (`query_budgets`), `chunk` query positions at a time -> (B, H_q, T, D)."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    return PageGatherAttention.apply(q, k, v, budgets, attn, scale, chunk)


def query_chunk(
    budgets: Tensor, page_size: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
    max_elements: int,
) -> int:  # fmt: skip
    """Query positions per chunk so that the largest per-chunk tensor (gathered K or V, the
    score rows of the sparse queries, or the dense queries' causal score rows) holds at most
    `max_elements` elements. budgets: (B, T) pages per query."""
    batch, seq_len = budgets.shape
    positions = torch.arange(seq_len, device=budgets.device)
    sparse = budgets < positions // page_size + 1  # (B, T)
    max_keys = page_size * int(torch.where(sparse, budgets, 1).max())  # gathered keys per query
    per_query = batch * max(num_kv_heads * max_keys * head_dim, num_q_heads * seq_len)
    return max(1, min(seq_len, max_elements // per_query))
