"""Obviously-correct loop implementations of page selection and paged decode, in float64.

Slow on purpose (Python loops over sequences, heads and pages, torch SDPA for the attention):
they exist so that the vectorised torch backend and the Triton kernels are both checked against
something whose correctness can be read off the page. Never used on a hot path.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from .paged_cache import PageSummary
from .selection import SelectedPages


def select_pages_reference(
    q: Tensor,
    summary: PageSummary,
    page_table: Tensor,
    seq_lens: Tensor,
    budgets: Tensor,
    *,
    score: str,
    page_size: int = 16,
    num_sink: int = 1,
    num_recent: int = 2,
) -> list[list[list[int]]]:
    """Selected logical pages as nested lists [b][kv_head] -> ascending page indices."""
    num_kv_heads = summary.num_kv_heads
    group = q.shape[1] // num_kv_heads
    result = []
    for b in range(q.shape[0]):
        n = -(-int(seq_lens[b]) // page_size)
        budget = int(budgets[b])
        rows = []
        for h in range(num_kv_heads):
            if n <= budget:
                rows.append(list(range(n)))
                continue
            q_group = q[b, h * group : (h + 1) * group].double()  # (G, D)
            forced = set(range(num_sink)) | set(range(n - num_recent, n))
            candidates = [p for p in range(n) if p not in forced]
            scores = {}
            for p in candidates:
                phys = int(page_table[b, p])
                if score == "centroid":
                    assert summary.k_mean is not None, "centroid scoring reads the means"
                    scores[p] = float(q_group.mean(0) @ summary.k_mean[phys, h].double())
                else:
                    assert summary.k_min is not None and summary.k_max is not None, "quest: both"
                    lo, hi = summary.k_min[phys, h].double(), summary.k_max[phys, h].double()
                    per_head = torch.maximum(q_group * lo, q_group * hi).sum(-1)  # (G,)
                    scores[p] = float(per_head.max())
            top = sorted(candidates, key=lambda p: -scores[p])[: budget - len(forced)]
            rows.append(sorted(forced | set(top)))
        result.append(rows)
    return result


def attention_reference(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    page_table: Tensor,
    seq_lens: Tensor,
    selected: SelectedPages | None = None,
    scale: float | None = None,
) -> Tensor:
    """Decode attention by gathering each (sequence, KV head)'s tokens page by page, then SDPA."""
    batch, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    scale = head_dim**-0.5 if scale is None else scale
    out = torch.empty(batch, num_q_heads, head_dim, dtype=torch.float64)
    for b in range(batch):
        seq_len = int(seq_lens[b])
        n = -(-seq_len // page_size)
        for h in range(num_kv_heads):
            if selected is None:
                pages = list(range(n))
            else:
                pages = selected.logical_pages[b, h, : int(selected.num_selected[b])].tolist()
            keys, values = [], []
            for p in pages:
                valid = min(page_size, seq_len - p * page_size)
                phys = int(page_table[b, p])
                keys.append(k_cache[phys, :valid, h].double())
                values.append(v_cache[phys, :valid, h].double())
            k = torch.cat(keys).expand(1, group, -1, -1)  # (1, G, T, D)
            v = torch.cat(values).expand(1, group, -1, -1)  # (1, G, T, D)
            q_group = q[b, h * group : (h + 1) * group].double()[None, :, None]  # (1, G, 1, D)
            o = F.scaled_dot_product_attention(q_group, k, v, scale=scale)  # (1, G, 1, D)
            out[b, h * group : (h + 1) * group] = o[0, :, 0]
    return out
