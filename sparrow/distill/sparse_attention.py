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
    q, k, v = query.float(), key.float(), value.float()  # fp32 like the engine's decode
    attn = sparrow_sparse.attn
    if module.layer_idx in attn.dense_layers:
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scaling, enable_gqa=True
        )  # (B, H_q, T, D)
    else:
        _, num_q_heads, _, head_dim = q.shape
        budgets = sparrow_sparse.query_budgets  # (B, T)
        chunk = query_chunk(
            budgets, attn.page_size, num_q_heads, k.shape[1], head_dim,
            sparrow_sparse.max_chunk_elements,
        )  # fmt: skip
        out = page_gather_attention(q, k, v, budgets, attn, scaling, chunk)  # (B, H_q, T, D)
    return out.transpose(1, 2).to(query.dtype).contiguous(), None  # (B, T, H_q, D)


def register_attention() -> str:
    """Make the attention function available to HF models by name (idempotent)."""
    AttentionInterface.register(ATTENTION_NAME, block_sparse_attention)
    return ATTENTION_NAME
