"""Paged block-sparse decode attention: KV cache layout, page summaries, page selection, decode.

This file re-exports the public ops and types. Map: dispatch.py (the public ops and which backend
runs each: auto | torch | triton | cpp), paged_cache.py (KV layout, writes, page summaries),
selection.py (page scores and choice), decode_torch.py (the torch reference and CPU path),
decode_cpu.py + decode_cpu.cpp (the fused CPU kernel), reference.py (float64 loop references),
checks.py (argument checks), launch_checks.py (each Triton launcher's rules, shared with the ops'
fakes), ops.py (torch ops over the Triton kernels decode_triton, score_triton, select_triton,
kv_write_triton, norm_rope_triton and swiglu_triton), aot.py (ahead-of-time compilation for
Hopper), compile_hook.py (Triton's post-compile hook). Triton is imported only when a Triton
kernel runs. This package imports nothing else from sparrow.
"""

from .decode_cpu import cpu_kernel_error, multi_query_decode_cpu, sparse_decode_cpu
from .decode_torch import (
    GatherPlan,
    MultiQueryPlan,
    attend_gathered,
    attend_multi_query,
    gather_kv,
    gather_plan,
    multi_query_plan,
)
from .dispatch import (
    BACKENDS,
    add_rms_norm,
    append_kv,
    paged_decode,
    qk_norm_rope,
    resolve_backend,
    select_pages,
    silu_mul,
    sparse_decode,
    uses_triton,
)
from .paged_cache import PageSummary, update_page_summaries, write_kv
from .selection import SCORE_MODES, SelectedPages, SelectionPlan, select_from_scores, selection_plan

__all__ = [
    "BACKENDS", "SCORE_MODES", "GatherPlan", "MultiQueryPlan", "PageSummary", "SelectedPages",
    "SelectionPlan", "add_rms_norm", "append_kv", "attend_gathered", "attend_multi_query",
    "cpu_kernel_error", "gather_kv", "gather_plan", "multi_query_decode_cpu", "multi_query_plan",
    "paged_decode", "qk_norm_rope", "resolve_backend", "select_from_scores", "select_pages",
    "selection_plan", "silu_mul", "sparse_decode", "sparse_decode_cpu", "update_page_summaries",
    "uses_triton", "write_kv",
]  # fmt: skip
