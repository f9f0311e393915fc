"""The public ops of sparrow.kernels and which backend runs each: `backend` = "auto" | "torch" |
"triton" | "cpp".

auto runs Triton on CUDA tensors; on CPU fp32 tensors the fused C++ kernel of `sparse_decode`
(decode_cpu.cpp, built on first use) when it builds, else torch. The torch backend is the reference
math and the CPU fallback; "cpp" is one fused op (`sparse_decode`), so `select_pages` and
`paged_decode` run torch under it. Every Triton launch goes through a registered torch op
(`torch.ops.sparrow.*`, ops.py), whose fake implementation lets fake tensors, torch.compile and
graph capture see it. Triton is imported only when a Triton kernel actually runs, so CPU users
never pay for it and tests can set TRITON_INTERPRET=1 before it is imported.
"""

import torch
from torch import Tensor

# Not `from . import ops`: tests/test_layering.py reads that as importing the package, whose
# __init__ imports this module (a cycle).
import sparrow.kernels.ops as ops

from .checks import check_decode_inputs, check_select_inputs
from .decode_cpu import cpu_kernel, cpu_kernel_error, sparse_decode_cpu
from .decode_torch import GatherPlan, attend_planned, gather_plan
from .launch_checks import MAX_PAGES
from .paged_cache import PageSummary, update_page_summaries, write_kv
from .selection import (
    SelectedPages,
    SelectionPlan,
    page_scores_torch,
    select_from_scores,
    selection_plan,
)

BACKENDS = ("auto", "torch", "triton", "cpp")


def select_pages(
    q: Tensor,
    summary: PageSummary,
    page_table: Tensor,
    seq_lens: Tensor,
    budgets: Tensor,
    *,
    score: str = "quest",
    page_size: int = 16,
    num_sink: int = 1,
    num_recent: int = 2,
    backend: str = "auto",
    validate: bool = True,
    plan: SelectionPlan | None = None,
) -> SelectedPages:
    """Choose the pages each (sequence, KV head) attends to at this decode step.

    q: (B, H_q, D) current queries; page_table: (B, max_pages) int32 physical ids; seq_lens: (B,)
    int32 tokens cached including the current one; budgets: (B,) int32 pages. The backend only
    changes how the work is launched: Triton scores pages in one fused gather+score kernel and
    chooses them (top-k, compaction, physical ids) in a second (select_triton.py); torch takes
    ~8 ops for the choice. Same pages on both, up to the order of equal scores. `validate=False`
    skips the value checks (page ids, budgets), as in `paged_decode`.
    `plan`: `selection_plan(page_table, seq_lens, budgets, ..., trim=True)` built once for all
    the sparse layers of a step (it depends on no layer's data); built here when None.
    """
    check_select_inputs(
        q, summary, page_table, seq_lens, budgets, score, page_size, num_sink, num_recent, validate
    )
    if plan is None:
        plan = selection_plan(
            page_table,
            seq_lens,
            budgets,
            page_size=page_size,
            num_sink=num_sink,
            num_recent=num_recent,
            trim=True,
        )
    page_table = page_table[:, : plan.phys.shape[1]]  # the columns some sequence uses
    if uses_triton(backend, q):
        scores = ops.page_scores(q, summary, page_table, seq_lens, score, page_size)
        # Rows wider than one program holds (> 128K tokens at page 16) take the torch choice.
        if max(page_table.shape[1], plan.max_selected) <= MAX_PAGES:
            return _choose_triton(
                scores, page_table, seq_lens, budgets, plan, page_size, num_sink, num_recent
            )
    else:
        if any(t.dtype != torch.float32 for t in summary.tables):
            raise TypeError("select_pages: the torch backend scores fp32 page summaries only")
        scores = page_scores_torch(q, summary, page_table, seq_lens, score, page_size, plan)
    return select_from_scores(
        scores,
        seq_lens,
        budgets,
        page_size=page_size,
        num_sink=num_sink,
        num_recent=num_recent,
        plan=plan,
    )


def _choose_triton(
    scores: Tensor,
    page_table: Tensor,
    seq_lens: Tensor,
    budgets: Tensor,
    plan: SelectionPlan,
    page_size: int,
    num_sink: int,
    num_recent: int,
) -> SelectedPages:
    """The Triton choice from the pages' scores (B, H_kv, P): top-k, compaction and physical
    ids in one kernel."""
    return ops.select_pages(
        scores,
        page_table,
        seq_lens.to(torch.int32),  # no-ops for the engine's int32 tensors
        budgets.to(device=scores.device, dtype=torch.int32),
        plan.num_selected,
        plan.max_selected,
        page_size=page_size,
        num_sink=num_sink,
        num_recent=num_recent,
    )


def paged_decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    page_table: Tensor,
    seq_lens: Tensor,
    selected: SelectedPages | None = None,
    *,
    scale: float | None = None,
    backend: str = "auto",
    validate: bool = True,
    plan: GatherPlan | None = None,
    workspace: list[Tensor] | None = None,
) -> Tensor:
    """Decode attention of one query token per sequence over its selected pages.

    q: (B, H_q, D); k_cache, v_cache: (num_pages, PAGE_SIZE, H_kv, D); page_table: (B, max_pages)
    int32; seq_lens: (B,) int32 including the current token; selected=None attends to every page.
    Returns (B, H_q, D) in q's dtype. `validate=False` skips the value checks (page ids in range),
    which cost a device sync; shapes, dtypes and strides are always checked. `plan`: the torch
    backend's gather plan of these page tables and lengths for `selected`, built once by
    `gather_plan` and shared by the layers of a step (the Triton kernel reads pages in place);
    `workspace`: the torch backend's reusable gather buffers (see `attend_planned`).
    """
    check_decode_inputs(q, k_cache, v_cache, page_table, seq_lens, selected, validate)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if uses_triton(backend, q):
        return ops.paged_decode(q, k_cache, v_cache, page_table, seq_lens, selected, scale)
    if plan is None:
        _, page_size, num_kv_heads, _ = k_cache.shape
        plan = gather_plan(page_table, seq_lens, selected, page_size, num_kv_heads)
    return attend_planned(q, k_cache, v_cache, plan, scale, workspace)


def sparse_decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    summary: PageSummary | None,
    page_table: Tensor,
    seq_lens: Tensor,
    budgets: Tensor | None,
    *,
    score: str = "quest",
    num_sink: int = 1,
    num_recent: int = 2,
    scale: float | None = None,
    backend: str = "auto",
    validate: bool = True,
) -> Tensor:
    """`select_pages` then `paged_decode` (arguments as theirs; `budgets` None: every page), in
    one pass per (sequence, KV head) on the cpp backend. Returns (B, H_q, D) in q's dtype."""
    page_size = k_cache.shape[1]
    check_decode_inputs(q, k_cache, v_cache, page_table, seq_lens, None, validate)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if budgets is not None:
        if summary is None:
            raise ValueError("sparse_decode: budgets need the layer's page summary")
        rule = (score, page_size, num_sink, num_recent)
        check_select_inputs(q, summary, page_table, seq_lens, budgets, *rule, validate)
    if resolve_backend(backend, q) == "cpp":
        return sparse_decode_cpu(
            q, k_cache, v_cache, summary, page_table, seq_lens, budgets,
            score=score, num_sink=num_sink, num_recent=num_recent, scale=scale,
        )  # fmt: skip
    selected = None
    if budgets is not None and summary is not None:  # checked above: budgets need it
        selected = select_pages(
            q, summary, page_table, seq_lens, budgets, score=score, page_size=page_size,
            num_sink=num_sink, num_recent=num_recent, backend=backend, validate=False,
        )  # fmt: skip
    return paged_decode(
        q, k_cache, v_cache, page_table, seq_lens, selected, scale=scale, backend=backend,
        validate=False,
    )  # fmt: skip


def add_rms_norm(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(x + residual, RMSNorm of it) in one Triton launch: CUDA (or the interpreter), fp16/bf16
    rows (N, C). See norm_rope_triton.add_rms_norm."""
    return ops.add_rms_norm(x, weight, eps, residual)


def qk_norm_rope(qk: Tensor, weight: Tensor | None, cos: Tensor, sin: Tensor, eps: float) -> Tensor:
    """Per-head RMSNorm (weight None: none) then RoPE of q and k heads (N, H, D) in one Triton
    launch: CUDA (or the interpreter), fp16/bf16. See norm_rope_triton.qk_norm_rope."""
    return ops.qk_norm_rope(qk, weight, cos, sin, eps)


def silu_mul(gate_up: Tensor) -> Tensor:
    """SwiGLU's silu(gate) * up of gate_up (N, 2 I) -> (N, I) in one Triton launch: CUDA (or the
    interpreter). See swiglu_triton.silu_mul."""
    return ops.silu_mul(gate_up)


def append_kv(
    k_cache: Tensor,
    v_cache: Tensor,
    k: Tensor,
    v: Tensor,
    slot_mapping: Tensor,
    summary: PageSummary | None = None,
    *,
    backend: str = "auto",
) -> None:
    """`write_kv`, then (with `summary`) the summary rows of the pages written, from their first
    `slot % PAGE_SIZE + 1` tokens: one Triton launch where `backend` runs Triton for `k`
    (kv_write_triton.py), else `write_kv` and `update_page_summaries`."""
    if uses_triton(backend, k):
        ops.write_kv(k_cache, v_cache, k, v, slot_mapping, summary)
        return
    write_kv(k_cache, v_cache, k, v, slot_mapping)
    if summary is not None:
        page_size = k_cache.shape[1]
        update_page_summaries(k_cache, summary, slot_mapping // page_size,
                              slot_mapping % page_size + 1)  # fmt: skip


def resolve_backend(backend: str, q: Tensor) -> str:
    """The backend `backend` runs for tensors like `q`: "triton", "cpp" or "torch".
    auto: Triton on CUDA; the C++ kernel for CPU fp32 when it builds (else torch)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "triton" or (backend == "auto" and q.is_cuda):
        return "triton"
    cpu_fp32 = q.device.type == "cpu" and q.dtype == torch.float32
    if backend == "cpp":
        if not cpu_fp32:
            raise ValueError(f"backend 'cpp' runs fp32 CPU tensors, got {q.dtype} on {q.device}")
        if cpu_kernel() is None:
            raise RuntimeError(f"backend 'cpp' is unavailable: {cpu_kernel_error()}")
        return "cpp"
    if backend == "auto" and cpu_fp32 and cpu_kernel() is not None:
        return "cpp"
    return "torch"


def uses_triton(backend: str, q: Tensor) -> bool:
    """Whether `backend` runs the Triton kernels for tensors like `q` (auto: on CUDA)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend == "triton" or (backend == "auto" and q.is_cuda)
