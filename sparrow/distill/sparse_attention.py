"""Training-time block-sparse attention: the engine's page selection as a differentiable mask.

The rollout engine decodes token by token and, in every sparse layer, lets each (sequence, KV
head) read only the pages `select_pages` picks (docs/DESIGN.md §1). Teacher-forcing a whole rollout
sequence at once reproduces that exactly when every query position t gets its own key mask:
- prompt queries (and every query of a dense layer) attend causally to all keys, like prefill;
- a completion query at t with recorded budget b < n = ceil((t + 1) / PAGE) pages keeps page 0,
  the last 2 pages (the partial one holding t included) and the top (b - 3) other pages by score,
  separately per KV head; with b >= n it is dense, as in the engine.
Scores use the engine's summaries, built by the same `update_page_summaries` from the post-RoPE
(and, for Qwen3, post-q/k-norm) keys; candidate pages lie wholly before t's page, so they are
full and their summaries are the ones the engine saw. Quest's bound is taken per query head then
maxed over the GQA group; the centroid score uses the group's mean query; the choice from the
scores is `select_from_scores` itself (same top-k and tie-breaking). Since position t's K/V in
layer l are computed from its own sparse attention in layers < l, as in decode, the masked
parallel forward equals the sequential decode up to float reassociation.

Selection is discrete and runs without gradient; gradients flow through q, k and v of the kept
keys. CPU path: one fp32 SDPA per layer with a boolean mask per (sequence, KV head, query, key),
the group's query heads stacked as rows (GQA without repeating K/V). It is hooked into the HF
model as a transformers attention function; the per-forward data travel as the
`sparrow_sparse` keyword argument, which transformers passes down to every attention call.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface

from sparrow.kernels import PageSummary, select_from_scores, update_page_summaries
from sparrow.rollout.paged_attention import SparseAttentionConfig

ATTENTION_NAME = "sparrow_block_sparse"


@dataclass
class SparseForwardMetadata:
    """What one teacher-forced forward needs beyond the tokens."""

    attn: SparseAttentionConfig  # the engine's page size, dense layers, score and window
    query_budgets: Tensor  # (B, T) int64 pages per sparse layer for the query at t


def query_budgets(budget_pages: Tensor, completion_mask: Tensor, page_size: int) -> Tensor:
    """Budget of each query position from the rollout's recorded budgets.

    The query at t predicts the token at t + 1 with t + 1 tokens in the cache, so it reads
    `budget_pages[:, t + 1]` pages; queries that predict no completion token (prompt, padding,
    the last position) are dense: their own page count. (B, T) -> (B, T) int64.
    """
    batch, seq_len = budget_pages.shape
    positions = torch.arange(seq_len, device=budget_pages.device)  # (T,)
    dense = ((positions + page_size) // page_size).expand(batch, seq_len)  # ceil((t + 1) / PAGE)
    recorded = F.pad(budget_pages.long()[:, 1:], (0, 1))  # (B, T) budget of the token at t + 1
    predicts = F.pad(completion_mask[:, 1:], (0, 1))  # (B, T) bool
    return torch.where(predicts, recorded, dense)


@torch.no_grad()
def page_scores(q: Tensor, keys: Tensor, attn: SparseAttentionConfig) -> Tensor:
    """Score of every page for every query, per KV head, as the engine computes it.

    q: (B, H_q, T, D) post-RoPE queries; keys: (B, H_kv, T, D) post-RoPE keys.
    Returns (B, T, H_kv, NP) fp32 with NP = ceil(T / PAGE); entries for pages not wholly before
    the query are meaningless (`select_from_scores` never takes them as candidates).
    """
    batch, num_q_heads, seq_len, head_dim = q.shape
    num_kv_heads = keys.shape[1]
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

    def per_head(table: Tensor) -> Tensor:  # (B, H_kv, 1, D, NP)
        return table.view(batch, num_pages, num_kv_heads, head_dim).permute(0, 2, 3, 1)[:, :, None]

    q_groups = q.float().reshape(batch, num_kv_heads, group, seq_len, head_dim)  # (B,H_kv,G,T,D)
    if attn.score == "centroid":
        q_mean = q_groups.mean(dim=2, keepdim=True)  # (B, H_kv, 1, T, D)
        scores = torch.matmul(q_mean, per_head(summary.k_mean)).squeeze(2)  # (B, H_kv, T, NP)
    elif attn.score == "quest":
        bound = torch.matmul(q_groups.clamp(min=0), per_head(summary.k_max))  # (B, H_kv, G, T, NP)
        bound += torch.matmul(q_groups.clamp(max=0), per_head(summary.k_min))
        scores = bound.amax(dim=2)  # (B, H_kv, T, NP)
    else:
        raise ValueError(f"score must be 'quest' or 'centroid', got {attn.score!r}")
    return scores.transpose(1, 2)  # (B, T, H_kv, NP)


@torch.no_grad()
def selected_key_mask(q: Tensor, keys: Tensor, meta: SparseForwardMetadata) -> Tensor:
    """Keys each (sequence, KV head, query) may attend to in a sparse layer.

    q: (B, H_q, T, D); keys: (B, H_kv, T, D). Returns (B, H_kv, T, T) bool, causal.
    """
    attn = meta.attn
    batch, num_kv_heads, seq_len, _ = keys.shape
    scores = page_scores(q, keys, attn)  # (B, T, H_kv, NP)
    num_pages = scores.shape[-1]
    positions = torch.arange(seq_len, device=q.device)  # (T,)
    selected = select_from_scores(
        scores.reshape(batch * seq_len, num_kv_heads, num_pages),
        (positions + 1).repeat(batch),  # (B * T,) tokens in the cache, the query's own included
        meta.query_budgets.reshape(-1),  # (B * T,)
        page_size=attn.page_size,
        num_sink=attn.num_sink,
        num_recent=attn.num_recent,
    )
    slots = selected.logical_pages.long()  # (B * T, H_kv, S)
    in_use = torch.arange(slots.shape[-1], device=q.device) < selected.num_selected[:, None, None]
    # Padding slots go to an extra column that is dropped.
    chosen = torch.zeros(
        batch * seq_len, num_kv_heads, num_pages + 1, dtype=torch.bool, device=q.device
    )
    chosen.scatter_(2, torch.where(in_use, slots, num_pages), True)
    chosen = chosen[..., :num_pages].view(batch, seq_len, num_kv_heads, num_pages)
    key_page = positions // attn.page_size  # (T,)
    keep = chosen.transpose(1, 2)[..., key_page]  # (B, H_kv, T, T)
    return keep & (positions[None, :] <= positions[:, None])


def block_sparse_attention(
    module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    sparrow_sparse: SparseForwardMetadata | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers attention function: query (B, H_q, T, D), key/value (B, H_kv, T, D) ->
    (B, T, H_q, D). Right-padded batches need no padding mask (real queries never see a later key).
    """
    if sparrow_sparse is None:
        raise ValueError(f"the {ATTENTION_NAME!r} attention needs the sparrow_sparse= argument")
    batch, num_q_heads, seq_len, head_dim = query.shape
    num_kv_heads = key.shape[1]
    group = num_q_heads // num_kv_heads
    q, k, v = query.float(), key.float(), value.float()  # fp32 like the engine's decode
    if module.layer_idx in sparrow_sparse.attn.dense_layers:
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scaling, enable_gqa=True
        )  # (B, H_q, T, D)
    else:
        keep = selected_key_mask(query, key, sparrow_sparse)  # (B, H_kv, T, T)
        rows = keep[:, :, None].expand(batch, num_kv_heads, group, seq_len, seq_len)
        rows = rows.reshape(batch, num_kv_heads, group * seq_len, seq_len)  # (B, H_kv, G*T, T)
        q_rows = q.reshape(batch, num_kv_heads, group * seq_len, head_dim)  # (B, H_kv, G*T, D)
        out = F.scaled_dot_product_attention(q_rows, k, v, attn_mask=rows, scale=scaling)
        out = out.view(batch, num_q_heads, seq_len, head_dim)  # (B, H_q, T, D)
    return out.transpose(1, 2).to(query.dtype).contiguous(), None  # (B, T, H_q, D)


def register_attention() -> str:
    """Make the attention function available to HF models by name (idempotent)."""
    AttentionInterface.register(ATTENTION_NAME, block_sparse_attention)
    return ATTENTION_NAME
