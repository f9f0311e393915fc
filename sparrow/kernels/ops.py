"""The Triton kernels as registered torch operators (`torch.ops.sparrow.*`).

Every Triton kernel the engine launches goes through one of these ops, so that anything that
works at the level of torch ops sees a launch as one op with known outputs: fake tensors (the
CPU rehearsal of the GPU path, tests/rehearsal/), torch.compile and CUDA-graph capture. Each op
has two implementations:
- real (CompositeExplicitAutograd: CPU under the interpreter, CUDA compiled): imports its
  launcher (`*_triton.py`) at the first call, so importing this module imports no Triton;
- fake: the launcher's own argument checks (launch_checks.py), then empty outputs of the shapes,
  dtypes and device the launcher returns. No kernel runs.
The in-place writes (`write_kv`: the KV cache and the page summaries) are declared in the schema
(`Tensor(a!)`), so a functionalising tracer knows what they mutate. Registered with
`torch.library.define` and `impl` rather than `custom_op`: the dispatch costs ~4 us per call on
this CPU instead of ~18 us, which an eager decode step pays per launch (~200 per step at 28
layers; a replayed CUDA graph pays none).

The ops take tensors and scalars only; kernels/dispatch.py unpacks `PageSummary` and
`SelectedPages` into them and packs the outputs back.
"""

import torch
from torch import Tensor

from .launch_checks import (
    check_add_rms_norm,
    check_decode_tiling,
    check_one_device,
    check_page_scores,
    check_qk_norm_rope,
    check_select_pages,
    check_silu_mul,
    check_write_kv,
)
from .paged_cache import PageSummary
from .selection import SelectedPages

_LIB = torch.library.Library("sparrow", "DEF")  # the ops live as long as this object

SCHEMAS = {
    "paged_decode": "paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, "
    "Tensor seq_lens, Tensor? logical_pages, Tensor? physical_pages, Tensor? num_selected, "
    "float scale) -> Tensor",
    "page_scores": "page_scores(Tensor q, Tensor? k_mean, Tensor? k_min, Tensor? k_max, "
    "Tensor page_table, Tensor seq_lens, str score, int page_size) -> Tensor",
    "select_pages": "select_pages(Tensor scores, Tensor page_table, Tensor seq_lens, "
    "Tensor budgets, Tensor num_selected, int max_selected, int page_size, int num_sink, "
    "int num_recent) -> (Tensor, Tensor)",
    "write_kv": "write_kv(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, "
    "Tensor slot_mapping, Tensor(c!)? k_mean, Tensor(d!)? k_min, Tensor(e!)? k_max) -> ()",
    "rms_norm": "rms_norm(Tensor x, Tensor weight, float eps) -> Tensor",
    "add_rms_norm": "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) "
    "-> (Tensor, Tensor)",
    "qk_norm_rope": "qk_norm_rope(Tensor qk, Tensor? weight, Tensor cos, Tensor sin, float eps) "
    "-> Tensor",
    "silu_mul": "silu_mul(Tensor gate_up) -> Tensor",
}


def _register(name: str):
    """Define op `name` (SCHEMAS) with the decorated function as its real implementation, for
    every device (CompositeExplicitAutograd)."""

    def wrap(real):
        _LIB.define(SCHEMAS[name])
        _LIB.impl(name, real, "CompositeExplicitAutograd")
        return real

    return wrap


def _fake(name: str):
    """Register the decorated function as op `name`'s fake implementation."""

    def wrap(fake):
        torch.library.register_fake(f"sparrow::{name}", fake, lib=_LIB)
        return fake

    return wrap


def _selection(
    logical: Tensor | None, physical: Tensor | None, num_selected: Tensor | None
) -> SelectedPages | None:
    if logical is None:
        return None
    assert num_selected is not None, "a selection comes with its counts"
    return SelectedPages(logical, num_selected, physical)


@_register("paged_decode")
def _paged_decode(q, k_cache, v_cache, page_table, seq_lens, logical, physical, num_sel, scale):
    from .decode_triton import paged_decode_triton

    selected = _selection(logical, physical, num_sel)
    return paged_decode_triton(q, k_cache, v_cache, page_table, seq_lens, selected, scale)


@_fake("paged_decode")
def _paged_decode_fake(q, k_cache, v_cache, page_table, seq_lens, logical, physical, num_sel,
                       scale):  # fmt: skip
    check_decode_tiling(q.shape[-1], k_cache.shape[1])
    tensors = (q, k_cache, v_cache, page_table, seq_lens, logical, physical, num_sel)
    check_one_device("paged_decode(triton)", *tensors)
    return q.new_empty(q.shape)  # (B, H_q, D), contiguous


@_register("page_scores")
def _page_scores(q, k_mean, k_min, k_max, page_table, seq_lens, score, page_size):
    from .score_triton import page_scores_triton

    summary = PageSummary(k_mean, k_min, k_max)
    return page_scores_triton(q, summary, page_table, seq_lens, score, page_size)


@_fake("page_scores")
def _page_scores_fake(q, k_mean, k_min, k_max, page_table, seq_lens, score, page_size):
    tables = check_page_scores(q, PageSummary(k_mean, k_min, k_max), score)
    check_one_device("select_pages(triton)", q, page_table, seq_lens)
    shape = (q.shape[0], tables[0].shape[1], page_table.shape[1])  # (B, H_kv, max_pages)
    return q.new_empty(shape, dtype=torch.float32)


@_register("select_pages")
def _select_pages(scores, page_table, seq_lens, budgets, num_selected, max_selected, page_size,
                  num_sink, num_recent):  # fmt: skip
    from .select_triton import select_pages_triton

    selected = select_pages_triton(
        scores, page_table, seq_lens, budgets, num_selected, max_selected,
        page_size=page_size, num_sink=num_sink, num_recent=num_recent,
    )  # fmt: skip
    return selected.logical_pages, selected.physical_pages


@_fake("select_pages")
def _select_pages_fake(scores, page_table, seq_lens, budgets, num_selected, max_selected,
                       page_size, num_sink, num_recent):  # fmt: skip
    check_select_pages(scores, page_table, seq_lens, budgets, max_selected)
    shape = (scores.shape[0], scores.shape[1], max_selected)  # (B, H_kv, S)
    return tuple(scores.new_empty(shape, dtype=torch.int32) for _ in range(2))


@_register("write_kv")
def _write_kv(k_cache, v_cache, k, v, slot_mapping, k_mean, k_min, k_max):
    from .kv_write_triton import write_kv

    summary = None if k_mean is k_min is k_max is None else PageSummary(k_mean, k_min, k_max)
    write_kv(k_cache, v_cache, k, v, slot_mapping, summary)


@_fake("write_kv")
def _write_kv_fake(k_cache, v_cache, k, v, slot_mapping, k_mean, k_min, k_max):
    summary = None if k_mean is k_min is k_max is None else PageSummary(k_mean, k_min, k_max)
    check_write_kv(k_cache, v_cache, k, v, slot_mapping, summary)


@_register("rms_norm")
def _rms_norm(x, weight, eps):
    from .norm_rope_triton import add_rms_norm

    return add_rms_norm(x, weight, eps)[1]


@_fake("rms_norm")
def _rms_norm_fake(x, weight, eps):
    check_add_rms_norm(x, weight, None)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@_register("add_rms_norm")
def _add_rms_norm(x, residual, weight, eps):
    from .norm_rope_triton import add_rms_norm

    return add_rms_norm(x, weight, eps, residual)


@_fake("add_rms_norm")
def _add_rms_norm_fake(x, residual, weight, eps):
    check_add_rms_norm(x, weight, residual)
    return tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(2))


@_register("qk_norm_rope")
def _qk_norm_rope(qk, weight, cos, sin, eps):
    from .norm_rope_triton import qk_norm_rope

    return qk_norm_rope(qk, weight, cos, sin, eps)


@_fake("qk_norm_rope")
def _qk_norm_rope_fake(qk, weight, cos, sin, eps):
    check_qk_norm_rope(qk, weight, cos, sin)
    return qk.new_empty(qk.shape)  # (N, H, D), contiguous


@_register("silu_mul")
def _silu_mul(gate_up):
    from .swiglu_triton import silu_mul

    return silu_mul(gate_up)


@_fake("silu_mul")
def _silu_mul_fake(gate_up):
    check_silu_mul(gate_up)
    return gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)  # (N, I)


def paged_decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    page_table: Tensor,
    seq_lens: Tensor,
    selected: SelectedPages | None,
    scale: float,
) -> Tensor:
    """paged_decode_triton as the op `sparrow::paged_decode`."""
    logical, physical, count = (None,) * 3
    if selected is not None:
        logical, physical = selected.logical_pages, selected.physical_pages
        count = selected.num_selected
    return torch.ops.sparrow.paged_decode.default(
        q, k_cache, v_cache, page_table, seq_lens, logical, physical, count, scale
    )


def page_scores(
    q: Tensor,
    summary: PageSummary,
    page_table: Tensor,
    seq_lens: Tensor,
    score: str,
    page_size: int,
) -> Tensor:
    """page_scores_triton as the op `sparrow::page_scores`: (B, H_kv, max_pages) fp32."""
    return torch.ops.sparrow.page_scores.default(
        q, summary.k_mean, summary.k_min, summary.k_max, page_table, seq_lens, score, page_size
    )


def select_pages(
    scores: Tensor,
    page_table: Tensor,
    seq_lens: Tensor,
    budgets: Tensor,
    num_selected: Tensor,
    max_selected: int,
    *,
    page_size: int,
    num_sink: int,
    num_recent: int,
) -> SelectedPages:
    """select_pages_triton as the op `sparrow::select_pages`."""
    logical, physical = torch.ops.sparrow.select_pages.default(
        scores, page_table, seq_lens, budgets, num_selected, max_selected,
        page_size, num_sink, num_recent,
    )  # fmt: skip
    return SelectedPages(logical_pages=logical, num_selected=num_selected, physical_pages=physical)


def write_kv(
    k_cache: Tensor,
    v_cache: Tensor,
    k: Tensor,
    v: Tensor,
    slot_mapping: Tensor,
    summary: PageSummary | None,
) -> None:
    """kv_write_triton.write_kv as the op `sparrow::write_kv` (in place)."""
    tables = (None,) * 3 if summary is None else (summary.k_mean, summary.k_min, summary.k_max)
    torch.ops.sparrow.write_kv.default(k_cache, v_cache, k, v, slot_mapping, *tables)


def add_rms_norm(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """norm_rope_triton.add_rms_norm as the ops `sparrow::add_rms_norm` and, without a residual
    (the sum is x itself, which an op may not return), `sparrow::rms_norm`."""
    if residual is None:
        return x, torch.ops.sparrow.rms_norm.default(x, weight, eps)
    return torch.ops.sparrow.add_rms_norm.default(x, residual, weight, eps)


def qk_norm_rope(qk: Tensor, weight: Tensor | None, cos: Tensor, sin: Tensor, eps: float) -> Tensor:
    """norm_rope_triton.qk_norm_rope as the op `sparrow::qk_norm_rope`."""
    return torch.ops.sparrow.qk_norm_rope.default(qk, weight, cos, sin, eps)


def silu_mul(gate_up: Tensor) -> Tensor:
    """swiglu_triton.silu_mul as the op `sparrow::silu_mul`."""
    return torch.ops.sparrow.silu_mul.default(gate_up)
