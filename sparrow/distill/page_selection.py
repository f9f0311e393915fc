"""The engine's page selection for a chunk of teacher-forced queries.

The engine decodes token by token and, in every sparse layer, lets each (sequence, KV head) read
the pages `select_pages` picks (docs/DESIGN.md §1). A teacher-forced query at position t has t + 1
tokens in its context, n = ceil((t + 1) / PAGE) pages; with a recorded budget b < n it keeps
page 0, the last 2 pages (the partial one holding t included) and the top (b - 3) other pages by
score, separately per KV head; with b >= n it reads every page (dense), as in the engine.
Scores use the engine's summaries, built by the same `update_page_summaries` from the post-RoPE
(and, for Qwen3, post-q/k-norm) keys; candidate pages lie wholly before t's page, so they are
full and their summaries are the ones the engine saw. Quest's bound is taken per query head then
maxed over the GQA group; the centroid score uses the group's mean query; the choice from the
scores is `select_from_scores` itself (same top-k and tie-breaking).

The summaries are built once per layer (`page_summary_tables`, O(T / PAGE) rows); scores and
selection run per chunk of queries (`select_query_pages`), so no (T, T / PAGE) score table is
ever held whole. Everything here is discrete and runs without gradient.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from sparrow.kernels import PageSummary, SelectedPages, select_from_scores, update_page_summaries
from sparrow.rollout.paged_attention import SparseAttentionConfig


@torch.no_grad()
def page_summary_tables(keys: Tensor, attn: SparseAttentionConfig) -> list[Tensor]:
    """keys (B, H_kv, T, D) post-RoPE -> the summary tables the score reads, each
    (B, H_kv, D, NP) fp32 with NP = ceil(T / PAGE): [k_mean] (centroid) or [k_max, k_min]
    (quest). The last page's row is built as if full (zero keys past T): it is never a
    candidate, so its value does not matter."""
    batch, num_kv_heads, seq_len, head_dim = keys.shape
    ps = attn.page_size
    num_pages = -(-seq_len // ps)
    padded = F.pad(keys.float(), (0, 0, 0, num_pages * ps - seq_len))  # (B, H_kv, NP*PAGE, D)
    # The engine's cache layout (pages, PAGE, H_kv, D), so its own summary code applies unchanged.
    cache = padded.view(batch, num_kv_heads, num_pages, ps, head_dim).permute(0, 2, 3, 1, 4)
    cache = cache.reshape(batch * num_pages, ps, num_kv_heads, head_dim).contiguous()
    summary = PageSummary.empty(batch * num_pages, num_kv_heads, head_dim, keys.device)
    fills = torch.full((batch * num_pages,), ps, dtype=torch.int64, device=keys.device)
    pages = torch.arange(batch * num_pages, device=keys.device)
    update_page_summaries(cache, summary, pages, fills)
    if attn.score == "centroid":
        tables = [summary.k_mean]
    elif attn.score == "quest":
        tables = [summary.k_max, summary.k_min]
    else:
        raise ValueError(f"score must be 'quest' or 'centroid', got {attn.score!r}")
    views = []
    for t in tables:
        assert t is not None, "a summary holds the tables of its score"
        views.append(t.view(batch, num_pages, num_kv_heads, head_dim).permute(0, 2, 3, 1))
    return views  # (B, H_kv, D, NP) each


@torch.no_grad()
def chunk_page_scores(q: Tensor, tables: list[Tensor], score: str) -> Tensor:
    """q (B, H_q, C, D) post-RoPE queries, tables from `page_summary_tables` -> (B, C, H_kv, NP)
    fp32 scores; entries for pages not wholly before the query are meaningless."""
    batch, num_q_heads, chunk, head_dim = q.shape
    num_kv_heads = tables[0].shape[1]
    group = num_q_heads // num_kv_heads
    q_groups = q.float().reshape(batch, num_kv_heads, group, chunk, head_dim)  # (B,H_kv,G,C,D)
    if score == "centroid":
        q_mean = q_groups.mean(dim=2, keepdim=True)  # (B, H_kv, 1, C, D)
        scores = torch.matmul(q_mean, tables[0][:, :, None]).squeeze(2)  # (B, H_kv, C, NP)
    else:  # quest: the bound per query head, then the group's best head
        bound = torch.matmul(q_groups.clamp(min=0), tables[0][:, :, None])  # (B,H_kv,G,C,NP)
        bound += torch.matmul(q_groups.clamp(max=0), tables[1][:, :, None])
        scores = bound.amax(dim=2)  # (B, H_kv, C, NP)
    return scores.transpose(1, 2)  # (B, C, H_kv, NP)


@torch.no_grad()
def select_query_pages(
    q: Tensor,
    tables: list[Tensor],
    positions: Tensor,
    budgets: Tensor,
    attn: SparseAttentionConfig,
) -> SelectedPages:
    """Pages each sparse query of a chunk reads, per KV head.

    q: (B, H_q, C, D) the chunk's queries; positions: (C,) their positions; budgets: (B, C)
    pages each may read. Returns rows in (B * C) order: logical_pages (B * C, H_kv, S) int32
    ascending, num_selected (B * C,). Dense queries (budget >= pages) are not this function's
    business: they get page 0 only, so that they do not widen S to their whole context.
    """
    batch, _, chunk, _ = q.shape
    num_kv_heads, num_pages = tables[0].shape[1], tables[0].shape[-1]
    sparse = budgets < positions // attn.page_size + 1  # (B, C) budget < ceil((t + 1) / PAGE)
    seq_lens = torch.where(sparse, positions + 1, 1)  # (B, C) tokens in the cache, t's own included
    scores = chunk_page_scores(q, tables, attn.score)  # (B, C, H_kv, NP)
    return select_from_scores(
        scores.reshape(batch * chunk, num_kv_heads, num_pages),
        seq_lens.reshape(-1),  # (B * C,)
        torch.where(sparse, budgets, 1).reshape(-1),  # (B * C,)
        page_size=attn.page_size,
        num_sink=attn.num_sink,
        num_recent=attn.num_recent,
    )
