"""PyTorch paged (block-sparse) decode attention: the reference math and the CPU production path.

One query token per sequence attends to the selected pages of its KV head. Vectorised over the
batch: one index_select gathers exactly the selected pages' tokens (so the cost scales with the
budget, not the context) straight into the (B, H_kv, tokens, D) layout SDPA wants, then one fp32
torch SDPA call with an additive bias masking positions past seq_len and padding slots.

Which cache rows to gather and the mask depend only on the page table, the lengths and the
selection, not on the layer: a `GatherPlan` built once per decode step serves every dense layer
(each layer's cache has the same layout), which saves ~20 small ops per layer.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .selection import SelectedPages


@dataclass
class GatherPlan:
    rows: Tensor  # (B * H_kv * S * PAGE,) int64 rows of a cache viewed as (pages*PAGE*H_kv, D)
    bias: Tensor  # (B, H_kv, 1, S * PAGE) fp32 attention bias: 0 where attended, -inf elsewhere


def gather_plan(
    page_table: Tensor,
    seq_lens: Tensor,
    selected: SelectedPages | None,
    page_size: int,
    num_kv_heads: int,
    num_slots: int | None = None,
) -> GatherPlan:
    """The cache rows and mask of one decode step (all pages when `selected` is None).
    `num_slots`: with `selected` None, pages gathered per row (>= the longest row's), known to
    the caller's host bookkeeping; None reads the longest length from the device (a sync)."""
    batch = page_table.shape[0]
    device = page_table.device
    seq_lens = seq_lens.long()  # (B,)
    num_logical = (seq_lens + page_size - 1) // page_size  # (B,)

    if selected is None:
        if num_slots is None:
            num_slots = int(num_logical.max())
        logical = torch.arange(num_slots, device=device).expand(batch, num_kv_heads, num_slots)
        num_selected = num_logical  # (B,)
    else:
        logical = selected.logical_pages.long()  # (B, H_kv, S)
        num_slots = logical.shape[2]
        num_selected = selected.num_selected.long()  # (B,)
    slot_valid = torch.arange(num_slots, device=device) < num_selected[:, None, None]  # (B, 1, S)
    logical = torch.where(slot_valid, logical, 0)  # (B, H_kv, S) padding -> page 0, masked below
    phys = torch.gather(page_table.long(), 1, logical.reshape(batch, -1))  # (B, H_kv * S)
    phys = phys.view(batch, num_kv_heads, num_slots)  # (B, H_kv, S)

    # Row of token (page, offset, head) in the cache viewed as (num_pages * PAGE_SIZE * H_kv, D).
    offsets = torch.arange(page_size, device=device)  # (PAGE_SIZE,)
    heads = torch.arange(num_kv_heads, device=device)[None, :, None, None]  # (1, H_kv, 1, 1)
    rows = (phys[..., None] * page_size + offsets) * num_kv_heads + heads  # (B, H_kv, S, PAGE_SIZE)
    position = logical[..., None] * page_size + offsets  # (B, H_kv, S, PAGE_SIZE)
    token_valid = slot_valid[..., None] & (position < seq_lens[:, None, None, None])
    # Slots past seq_len may hold garbage, even NaN, which a masked SDPA still multiplies by its
    # zero probability (NaN): read the row's first token there instead (always valid) and mask it.
    # Cheaper than a torch.where pass over the gathered K/V.
    rows = torch.where(token_valid, rows, rows[:, :, :1, :1]).reshape(-1)
    mask = token_valid.view(batch, num_kv_heads, 1, num_slots * page_size)
    # SDPA would turn a boolean mask into this bias on every call; a plan serves many layers.
    bias = torch.zeros(mask.shape, dtype=torch.float32, device=device)
    bias.masked_fill_(~mask, -torch.inf)
    return GatherPlan(rows=rows, bias=bias)


def attend_planned(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    plan: GatherPlan,
    scale: float,
    workspace: list[Tensor] | None = None,
) -> Tensor:
    """Decode attention over the tokens `plan` names. q (B, H_q, D) -> (B, H_q, D) in q's dtype."""
    keys, values = gather_kv(k_cache, v_cache, plan, workspace)
    return attend_gathered(q, keys, values, plan.bias, scale)


def gather_kv(
    k_cache: Tensor, v_cache: Tensor, plan: GatherPlan, workspace: list[Tensor] | None = None
) -> tuple[Tensor, Tensor]:
    """The K and V of the tokens `plan` names, each (B, H_kv, S * PAGE, D) in the cache's dtype.

    `workspace`: two flat buffers (K, V) the gathered tokens are written into, replaced in the
    list by larger ones when too small, so that a caller keeps them across layers and steps. A
    dense step gathers tens of MB per layer; a fresh allocation of that size may be mmapped and
    page-faulted in on every call (glibc's threshold moves with the allocation history): slow
    bench runs spent 2-3 min in the kernel before these buffers, 10-17 s after."""
    batch, num_kv_heads, _, num_tokens = plan.bias.shape
    head_dim = k_cache.shape[-1]
    gathered = []
    for i, cache in enumerate((k_cache, v_cache)):
        flat = cache.reshape(-1, head_dim)  # (pages * PAGE * H_kv, D)
        if workspace is None:
            gathered.append(flat.index_select(0, plan.rows))
            continue
        size = plan.rows.numel() * head_dim
        if workspace[i].numel() < size or workspace[i].dtype != cache.dtype:
            workspace[i] = torch.empty(size, dtype=cache.dtype, device=cache.device)
        out = workspace[i][:size].view(-1, head_dim)  # (rows, D)
        gathered.append(torch.index_select(flat, 0, plan.rows, out=out))
    shape = (batch, num_kv_heads, num_tokens, head_dim)
    return gathered[0].view(shape), gathered[1].view(shape)


def attend_gathered(q: Tensor, keys: Tensor, values: Tensor, bias: Tensor, scale: float) -> Tensor:
    """q (B, H_q, D) against keys, values (B, H_kv, T, D) (any strides with a unit last one) under
    an additive fp32 bias broadcastable to (B, H_kv, 1, T) -> (B, H_q, D) in q's dtype."""
    batch, num_q_heads, head_dim = q.shape
    num_kv_heads = keys.shape[1]
    group = num_q_heads // num_kv_heads
    # The group's G query heads are SDPA's query rows against their KV head's keys: GQA without
    # repeating K/V, in one call. (Not for speed: at decode shapes, 2 threads, matmul + softmax +
    # matmul took 0.73-1.0x SDPA's time; both are bound by reading K and V once.)
    q_groups = q.float().reshape(batch, num_kv_heads, group, head_dim)  # (B, H_kv, G, D)
    out = F.scaled_dot_product_attention(
        q_groups, keys.float(), values.float(), attn_mask=bias, scale=scale
    )  # (B, H_kv, G, D)
    return out.reshape(batch, num_q_heads, head_dim).to(q.dtype)  # (B, H_q, D)


@dataclass
class MultiQueryPlan:
    """Several query rows per sequence over its pages (the verify pass of speculative decoding):
    each sequence's pages gathered once, its rows' queries stacked as SDPA query rows."""

    gather: GatherPlan  # every page of each sequence, up to its longest row
    bias: Tensor  # (S, 1, R * G, T) fp32: 0 where query (row, head of the group) attends
    row_of_slot: Tensor  # (S * R,) int64 row of q in each (sequence, slot); padding: a real row
    slot_of_row: Tensor  # (N,) int64 the (sequence, slot) of each row of q


def multi_query_plan(
    page_table: Tensor,
    seq_lens: Tensor,
    num_rows: list[int],
    longest: int,
    page_size: int,
    num_kv_heads: int,
    group: int,
) -> MultiQueryPlan:
    """page_table (S, P); seq_lens (N,) tokens each row attends to (its own included), rows of one
    sequence consecutive, num_rows[s] of them (host list, >= 1 each); `longest`: the longest
    row's length, known to the caller's host bookkeeping (no device sync here)."""
    device = page_table.device
    num_seqs, most = len(num_rows), max(num_rows)
    starts = [0]
    for n in num_rows:
        starts.append(starts[-1] + n)
    row_of_slot = [starts[s] + min(j, n - 1) for s, n in enumerate(num_rows) for j in range(most)]
    slot_of_row = [s * most + j for s, n in enumerate(num_rows) for j in range(n)]
    row_of_slot_t = torch.tensor(row_of_slot, device=device)
    lens = seq_lens.long()[row_of_slot_t].view(num_seqs, most)  # (S, R)
    gather = gather_plan(
        page_table, lens.amax(dim=1), None, page_size, num_kv_heads,
        num_slots=-(-longest // page_size),
    )  # fmt: skip
    num_tokens = gather.bias.shape[-1]
    visible = torch.arange(num_tokens, device=device) < lens[..., None]  # (S, R, T)
    bias = torch.zeros(visible.shape, dtype=torch.float32, device=device)
    bias = bias.masked_fill_(~visible, -torch.inf)[:, :, None, :]  # (S, R, 1, T)
    bias = bias.expand(num_seqs, most, group, num_tokens).reshape(num_seqs, 1, -1, num_tokens)
    return MultiQueryPlan(gather, bias, row_of_slot_t, torch.tensor(slot_of_row, device=device))


def attend_multi_query(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    plan: MultiQueryPlan,
    scale: float,
    workspace: list[Tensor] | None = None,
) -> Tensor:
    """q (N, H_q, D) -> (N, H_q, D) in q's dtype: each row over its sequence's tokens in `plan`."""
    keys, values = gather_kv(k_cache, v_cache, plan.gather, workspace)  # (S, H_kv, T, D) each
    num_seqs, num_kv_heads = keys.shape[:2]
    _, num_q_heads, head_dim = q.shape
    group = num_q_heads // num_kv_heads
    most = plan.row_of_slot.numel() // num_seqs
    queries = q.float()[plan.row_of_slot].view(num_seqs, most, num_kv_heads, group, head_dim)
    queries = queries.transpose(1, 2).reshape(num_seqs, num_kv_heads, most * group, head_dim)
    out = F.scaled_dot_product_attention(
        queries, keys.float(), values.float(), attn_mask=plan.bias, scale=scale
    )  # (S, H_kv, R * G, D)
    out = out.view(num_seqs, num_kv_heads, most, group, head_dim).transpose(1, 2)
    out = out.reshape(num_seqs * most, num_q_heads, head_dim)  # (S * R, H_q, D)
    return out[plan.slot_of_row].to(q.dtype)
