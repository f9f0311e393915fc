"""Training-time block-sparse attention: the engine's page selection, differentiable, per token.

The rollout engine decodes token by token and, in every sparse layer, lets each (sequence, KV
head) read only the pages `select_pages` picks (docs/DESIGN.md §1). Teacher-forcing a whole rollout
sequence at once reproduces that when every query position t reads the pages the decode step for
the token at t + 1 read (page_selection.py gives the rule): prompt queries (and every query of a
dense layer) attend causally to all keys, like prefill; a completion query with a recorded
budget below its page count reads its own selection. Since position t's K/V in layer l are
computed from its own sparse attention in layers < l, as in decode, the parallel forward equals
the sequential decode up to float reassociation.

Sparse layers run `page_gather_attention` (page_gather_attention.py): per chunk of queries, the
selected pages are gathered and attended over, and the backward pass re-gathers them, so memory
is O(T x budget), not O(T^2). Selection is discrete and runs without gradient; gradients flow
through q, k and v of the kept keys. It is hooked into the HF model as a transformers attention
function; the per-forward data travel as the `sparrow_sparse` keyword argument, which
transformers passes down to every attention call.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface

from sparrow.distill.page_gather_attention import page_gather_attention, query_chunk
from sparrow.rollout.paged_attention import SparseAttentionConfig

ATTENTION_NAME = "sparrow_block_sparse"


@dataclass
class SparseForwardMetadata:
    """What one teacher-forced forward needs beyond the tokens."""

    attn: SparseAttentionConfig  # the engine's page size, dense layers, score and window
    query_budgets: Tensor  # (B, T) int64 pages per sparse layer for the query at t
    # Bound on the largest tensor of one query chunk (gathered K/V, score rows), in elements:
    # 2^24 fp32 = 64 MiB. Larger chunks mean fewer, larger matmuls; memory stays O(T x budget).
    max_chunk_elements: int = 1 << 24


def query_budgets(
    budget_pages: Tensor, completion_mask: Tensor, page_size: int, padding_pages: int | None = None
) -> Tensor:
    """Budget of each query position from the rollout's recorded budgets.

    The query at t predicts the token at t + 1 with t + 1 tokens in the cache, so it reads
    `budget_pages[:, t + 1]` pages; queries that predict no completion token (prompt, the last
    position) are dense: their own page count. Padding (past a row's last completion token) is
    dense too, unless `padding_pages` is given: padding outputs reach no real token, and in a row
    much shorter than the batch a dense read would cost O(T^2) for nothing, so the training
    forward lets them read that many pages (sink + recent) instead. (B, T) -> (B, T) int64.
    """
    batch, seq_len = budget_pages.shape
    positions = torch.arange(seq_len, device=budget_pages.device)  # (T,)
    dense = ((positions + page_size) // page_size).expand(batch, seq_len)  # ceil((t + 1) / PAGE)
    recorded = F.pad(budget_pages.long()[:, 1:], (0, 1))  # (B, T) budget of the token at t + 1
    predicts = F.pad(completion_mask[:, 1:], (0, 1))  # (B, T) bool
    budgets = torch.where(predicts, recorded, dense)  # (B, T)
    if padding_pages is None:
        return budgets
    last = (completion_mask.long() * positions).amax(dim=1, keepdim=True)  # (B, 1) last token
    return torch.where(positions > last, dense.clamp(max=padding_pages), budgets)


def hf_attention(name: str, sparse_layer: Callable) -> Callable:
    """A transformers attention function named `name`: dense layers run causal SDPA, sparse
    layers `sparse_layer(query, key, value, scaling, meta) -> (B, H_q, T_q, D)`. query (B, H_q,
    T_q, D), key/value (B, H_kv, T, D) -> (B, T_q, H_q, D), fp32 inside like the engine's
    decode. The queries are the last T_q positions: T_q < T when a prefix's K/V came from a
    cache. Right-padded batches need no padding mask (real queries never see a later key)."""

    def attention(
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
        if sparrow_sparse is None:
            raise ValueError(f"the {name!r} attention needs the sparrow_sparse= argument")
        if module.layer_idx in sparrow_sparse.attn.dense_layers:
            # Queries after a cached prefix: zero query rows in front of them make the problem
            # square, so SDPA's own causal mask applies and no (T_q, T) mask is built and kept
            # for backward (O(T^2) memory); a prefix row costs its triangle, S^2 / 2 in all.
            prefix_len = key.shape[2] - query.shape[2]
            q = F.pad(query.float(), (0, 0, prefix_len, 0))  # (B, H_q, T, D)
            out = F.scaled_dot_product_attention(
                q, key.float(), value.float(), is_causal=True, scale=scaling, enable_gqa=True
            )[:, :, prefix_len:]  # (B, H_q, T_q, D)
        else:
            out = sparse_layer(query, key, value, scaling, sparrow_sparse)  # (B, H_q, T, D)
        return out.transpose(1, 2).to(query.dtype).contiguous(), None  # (B, T, H_q, D)

    return attention


def gathered_sparse_layer(
    query: Tensor, key: Tensor, value: Tensor, scaling: float, meta: SparseForwardMetadata
) -> Tensor:
    """A sparse layer by page gathering, chunked over queries: (B, H_q, T_q, D)."""
    q, k, v = query.float(), key.float(), value.float()
    _, num_q_heads, _, head_dim = q.shape
    budgets = meta.query_budgets  # (B, T)
    chunk = query_chunk(
        budgets, meta.attn.page_size, num_q_heads, k.shape[1], head_dim, meta.max_chunk_elements
    )
    return page_gather_attention(q, k, v, budgets, meta.attn, scaling, chunk)


block_sparse_attention = hf_attention(ATTENTION_NAME, gathered_sparse_layer)


def register_attention() -> str:
    """Make the attention function available to HF models by name (idempotent)."""
    AttentionInterface.register(ATTENTION_NAME, block_sparse_attention)
    return ATTENTION_NAME
