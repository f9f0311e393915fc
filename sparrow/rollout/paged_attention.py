"""The paged KV cache of one engine and the attention that reads it during decode.

Owns the K/V pages of every layer (allocated once, sized by `num_pages`), the page summaries of
the sparse layers, and the per-step metadata that says where each token goes. Decode attention
is dense on `dense_layers` and block-sparse elsewhere: pages are chosen per (sequence, KV head)
by `select_pages` with the sequence's budget, then `paged_decode` attends to them (docs/DESIGN.md);
on CPU fp32 the fused C++ kernel (`sparse_decode`, kernels/decode_cpu.cpp) does both in one pass.
The dense layers read a contiguous copy of their K/V that each step extends by one token
(`DenseKVCopy`) rather than gathering every page again; on CPU fp32, when the rows share most of
their pages (samples of one prompt), they go through the kernel over every page instead.
Page summaries (one table over all layers x pages, viewed per sparse layer) are refreshed by
`update_summaries` once per step for all sparse layers together, after the forward: a step never
scores the page its token lands in (the last `num_recent` >= 1 pages are always attended), so the
deferred refresh is exact and costs one op sequence per step instead of one per layer. On the
Triton path each sparse layer's KV write refreshes its page's summary in the same launch instead
(`writes_decode_summaries`): no op sequence at all. The
runner skips it when no schedule is set: sequences live within one generate call, and the
schedule does not change during one.
"""

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sparrow.kernels import (
    GatherPlan,
    MultiQueryPlan,
    PageSummary,
    SelectedPages,
    SelectionPlan,
    append_kv,
    attend_gathered,
    attend_multi_query,
    gather_plan,
    multi_query_decode_cpu,
    multi_query_plan,
    paged_decode,
    resolve_backend,
    select_pages,
    selection_plan,
    sparse_decode_cpu,
    update_page_summaries,
    uses_triton,
    write_kv,
)
from sparrow.rollout.dense_kv import DenseKVCopy


@dataclass
class SparseAttentionConfig:
    page_size: int  # tokens per KV page: the engine's (EngineConfig.page_size), no default here
    dense_layers: tuple[int, ...] = (0, 1)  # layers that always attend to every page
    score: str = "quest"  # page score of the sparse layers: "quest" | "centroid"
    num_sink: int = 1  # first pages always kept (attention sink)
    num_recent: int = 2  # last pages always kept (recent window, with the partial page)
    backend: str = "auto"  # kernel backend: "auto" | "torch" | "triton" | "cpp"
    # torch backend: keep the dense layers' K/V contiguous between steps (dense_kv.py) instead of
    # gathering every page at every step; costs up to the pool's memory again for those layers.
    dense_kv_copy: bool = True
    # C++ kernel: dense layers of rows that share pages read them through the fused kernel (see
    # `decode_attention`); False: per-row contiguous copies, as for rows that share nothing.
    shared_page_kernel: bool = True


@dataclass
class PrefillMetadata:
    kv_rows: Tensor  # (M,) int64, rows of the flattened prefill batch whose K/V are written
    slot_mapping: Tensor  # (M,) int64, cache slot (page * page_size + offset) of each such row
    page_ids: Tensor  # (P,) int64, physical pages written, for the summaries
    fill_counts: Tensor  # (P,) int64, valid tokens in each of them
    # Per group, cache slots (C,) int64 of its first C tokens, already cached (a shared prefix):
    # the group's new tokens attend to them before their own. None (or a None entry): no context.
    context_slots: list[Tensor | None] | None = None


@dataclass
class DecodeMetadata:
    """Built once per decode step (decode_plan.py, then `PagedKVCache.prepare_decode`); read by
    every layer. Nothing here is read back to the host during the forward."""

    slot_mapping: Tensor  # (B,) int64, cache slot of each sequence's input token
    page_table: Tensor  # (B, P) int32, physical page of each logical page (P >= every row's)
    seq_lens: Tensor  # (B,) int32, cached tokens including the input token
    last_page_ids: Tensor  # (B,) int64, page the input token lands in
    last_page_fill: Tensor  # (B,) int64, valid tokens in that page after the write
    budgets: Tensor | None  # (B,) int32 pages per sparse layer; None: every layer dense
    max_selected: int = 0  # sparse steps: upper bound on any row's kept pages (host-known)
    max_top: int = 0  # sparse steps: upper bound on any row's pages chosen by score
    # Whether the rows reference each of their physical pages twice or more on average, as samples
    # of one prompt do (set by the runner from host lists when `reads_shared_pages`).
    shared_pages: bool = False
    # CPU torch scoring of samples that share pages: (distinct (U,), column (B, P)), computed by
    # the runner before the forward (data-dependent shapes), see selection.distinct_pages
    distinct: tuple[Tensor, Tensor] | None = None
    dense_plan: GatherPlan | None = None  # torch backend: built by the step's first dense layer
    selection: SelectionPlan | None = None  # sparse steps: built by `prepare_decode`


@dataclass
class VerifyMetadata:
    """The dense verify pass of speculative decoding: several query rows per sequence (its last
    cached token and its drafts, consecutive), each attending to its sequence's cached tokens up
    to and including itself. Built by the runner from host lists; read by every layer."""

    slot_mapping: Tensor  # (N,) int64, cache slot of each row's token (its K/V are rewritten)
    page_table: Tensor  # (S, P) int32, each sequence's physical pages
    query_starts: Tensor  # (S + 1,) int32, the first row of each sequence, then N
    seq_lens: Tensor  # (N,) int32, tokens each row attends to, its own included
    num_rows: list[int]  # (S,) host: rows per sequence
    longest: int  # host: the longest row's seq_len
    # Triton: each row's sequence's page table (N, P), for the one-query decode kernel
    row_table: Tensor | None = None
    plan: MultiQueryPlan | None = None  # torch backend: built by the pass's first layer


class PagedKVCache:
    def __init__(
        self,
        cfg: SparseAttentionConfig,
        *,
        num_layers: int,
        num_pages: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        bad = [i for i in cfg.dense_layers if not 0 <= i < num_layers]
        if bad:
            raise ValueError(f"dense_layers {bad} out of range for a {num_layers}-layer model")
        self.cfg = cfg
        self.num_pages = num_pages
        shape = (num_layers, num_pages, cfg.page_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, P, PAGE, H_kv, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (L, P, PAGE, H_kv, D)
        # Row l * num_pages + p summarises page p of layer l (dense layers' rows stay unused), so
        # that the flattened cache and this table share indices. Only the tables the score mode
        # reads; in the cache dtype where the Triton kernel scores them (the torch and C++ paths
        # score fp32 tables).
        summary_dtype = dtype if uses_triton(cfg.backend, self.k) else torch.float32
        self._summary = PageSummary.empty(
            num_layers * num_pages, num_kv_heads, head_dim, device,
            score=cfg.score, dtype=summary_dtype,
        )  # fmt: skip
        self._sparse_layers = [i for i in range(num_layers) if i not in cfg.dense_layers]
        # Sparse layer ids in chunks that bound the summary refresh's temporary copy (~4K pages),
        # as device tensors made once: no host-to-device copy per step.
        self._layer_chunks: dict[int, list[Tensor]] = {}
        # The selection rule's sizes, as both the step's plan and each layer's choice take them.
        self._rule: dict[str, Any] = dict(
            page_size=cfg.page_size, num_sink=cfg.num_sink, num_recent=cfg.num_recent
        )
        # Decode's gathered K and V (torch backend), reused by every layer and step.
        self._workspace = [torch.empty(0, dtype=dtype, device=device) for _ in range(2)]
        # Sparse layers: selection and attention fused in C++ (CPU fp32, when it builds).
        self._fused_sparse = resolve_backend(cfg.backend, self.k) == "cpp"
        # Whether the Triton kernels run (CUDA): resolved once, not per layer and step.
        self._triton = uses_triton(cfg.backend, self.k)
        self.dense_copy = None
        if cfg.dense_kv_copy and not uses_triton(cfg.backend, self.k):
            self.dense_copy = DenseKVCopy(
                pool_tokens=num_pages * cfg.page_size,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
                dtype=dtype,
                device=device,
            )
        self.summaries: list[PageSummary | None] = [None] * num_layers
        for i in self._sparse_layers:
            rows = slice(i * num_pages, (i + 1) * num_pages)
            tables = (self._summary.k_mean, self._summary.k_min, self._summary.k_max)
            self.summaries[i] = PageSummary(*(None if t is None else t[rows] for t in tables))

    @property
    def reads_shared_pages(self) -> bool:
        """Whether decode reads `DecodeMetadata.shared_pages` (the fused CPU kernel): the runner
        computes it only then."""
        return self._fused_sparse and self.cfg.shared_page_kernel

    @property
    def writes_decode_summaries(self) -> bool:
        """Whether each sparse layer's decode KV write also refreshes the summary of the page it
        writes (the Triton path): the runner then skips `update_summaries` after decode."""
        return self._triton

    @property
    def dedupes_scoring(self) -> bool:
        """Whether sparse steps score shared pages once (CPU torch scoring): the runner then
        passes `DecodeMetadata.distinct` when the rows share enough pages."""
        return not self._fused_sparse and not self._triton

    def begin_decode(self, seq_ids: list[int], seq_lens: list[int]) -> None:
        """Before each decode step: the rows' sequence ids and cached tokens (input included)."""
        if self.dense_copy is not None:
            self.dense_copy.begin_step(seq_ids, seq_lens)

    def prepare_decode(self, meta: DecodeMetadata) -> None:
        """The part of the step's plan that the forward itself builds from `meta`'s tensors (and
        a captured graph replays): the sparse layers' selection plan. Fixed shapes, no sync."""
        if self._fused_sparse:  # the C++ kernel takes a contiguous table: copy it once
            meta.page_table = meta.page_table.contiguous()
        if meta.budgets is None or not self._sparse_layers or self._fused_sparse:
            return
        meta.selection = selection_plan(
            meta.page_table,
            meta.seq_lens,
            meta.budgets,
            **self._rule,
            max_selected=meta.max_selected,
            max_top=meta.max_top,
            shared=meta.distinct,
        )

    def write_prefill(self, layer: int, k: Tensor, v: Tensor, meta: PrefillMetadata) -> None:
        """k, v (N, H_kv, D) of the flattened prefill batch; shared prompt rows are written once."""
        if self.dense_copy is not None:
            self.dense_copy.invalidate()
        write_kv(self.k[layer], self.v[layer], k[meta.kv_rows], v[meta.kv_rows], meta.slot_mapping)

    def read_slots(self, layer: int, slots: Tensor) -> tuple[Tensor, Tensor]:
        """K, V (C, H_kv, D) of layer `layer` at cache slots `slots` (C,) (page * PAGE + offset)."""
        k_flat = self.k[layer].view(-1, *self.k.shape[3:])  # (P * PAGE, H_kv, D)
        v_flat = self.v[layer].view(-1, *self.v.shape[3:])  # (P * PAGE, H_kv, D)
        return k_flat[slots], v_flat[slots]

    @torch.inference_mode()
    def update_summaries(self, page_ids: Tensor, fill_counts: Tensor) -> None:
        """Refresh pages `page_ids` (P,) holding `fill_counts` (P,) tokens in every sparse layer."""
        if not self._sparse_layers or page_ids.numel() == 0:
            return
        k_flat = self.k.view(-1, *self.k.shape[2:])  # (L * num_pages, PAGE, H_kv, D)
        for layers in self._chunks(page_ids.numel(), page_ids.device):
            rows = (layers[:, None] * self.num_pages + page_ids[None, :]).reshape(-1)
            fills = fill_counts.repeat(len(layers))
            update_page_summaries(k_flat, self._summary, rows, fills)

    def _chunks(self, num_pages: int, device: torch.device) -> list[Tensor]:
        """The sparse layers split so that a chunk refreshes at most ~4K pages at once."""
        per_call = max(1, 4096 // num_pages)
        if per_call not in self._layer_chunks:
            ids = self._sparse_layers
            self._layer_chunks[per_call] = [
                torch.tensor(ids[i : i + per_call], device=device)
                for i in range(0, len(ids), per_call)
            ]
        return self._layer_chunks[per_call]

    def decode_attention(
        self, layer: int, q: Tensor, k: Tensor, v: Tensor, meta: DecodeMetadata
    ) -> Tensor:
        """q (B, H_q, D), this step's k, v (B, H_kv, D) -> attention output (B, H_q, D)."""
        k_cache, v_cache = self.k[layer], self.v[layer]
        summary = self.summaries[layer]
        # Triton: K, V and (sparse layers) the page summary in one launch; else the index copies,
        # and the runner refreshes the summaries of every sparse layer after the forward.
        if self._triton:
            append_kv(k_cache, v_cache, k, v, meta.slot_mapping, summary, backend="triton")
        else:
            write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        sparse = summary is not None and meta.budgets is not None
        if self._fused_sparse and (sparse or meta.shared_pages):
            # Sparse layers: selection and attention in one call. Dense layers of rows sampled
            # from one prompt: the kernel over every page reads each shared page from the cache
            # once for all rows, where per-row contiguous copies hold and read one copy per row
            # (8 x 4K shared: 2.8 vs 4.3 ms per layer; without sharing the copies win, 4.0 vs 4.7).
            # The backend was resolved and the layout fixed at construction: no per-layer checks.
            return sparse_decode_cpu(
                q, k_cache, v_cache, summary if sparse else None, meta.page_table, meta.seq_lens,
                meta.budgets if sparse else None,
                score=self.cfg.score, num_sink=self.cfg.num_sink, num_recent=self.cfg.num_recent,
                scale=q.shape[-1] ** -0.5,
            )  # fmt: skip
        selected = self._select(q, summary, meta) if sparse and summary is not None else None
        if selected is None and not self._triton:
            return self._dense_gathered(layer, q, k, v, meta)
        return self._paged_decode(layer, q, meta, selected, plan=None)

    def prepare_verify(self, meta: VerifyMetadata) -> None:
        """Before a verify pass: its K/V writes change tokens the dense layers' contiguous copy
        may hold (drafts written under sparse attention), so the copy is rebuilt next step."""
        if self.dense_copy is not None:
            self.dense_copy.invalidate()
        if self._triton:
            rows = torch.repeat_interleave(
                torch.arange(len(meta.num_rows)), torch.tensor(meta.num_rows)
            ).to(meta.page_table.device)
            meta.row_table = meta.page_table[rows]  # (N, P)

    def verify_attention(
        self, layer: int, q: Tensor, k: Tensor, v: Tensor, meta: VerifyMetadata
    ) -> Tensor:
        """q (N, H_q, D), the rows' k, v (N, H_kv, D) -> (N, H_q, D): the rows' K/V written over
        whatever their slots held (the drafts' sparse-attention values), then dense attention of
        each row to its sequence's tokens before it and itself, read from the pages in place (no
        per-sequence copy of the context, as a prefill over cached tokens makes)."""
        k_cache, v_cache = self.k[layer], self.v[layer]
        write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        scale = q.shape[-1] ** -0.5
        if self._fused_sparse:  # CPU fp32: one task per (sequence, KV head) reads its K/V once
            return multi_query_decode_cpu(
                q, k_cache, v_cache, meta.page_table, meta.query_starts, meta.seq_lens, scale=scale
            )
        if self._triton:  # the one-query kernel with a row per query (each reads its pages)
            assert meta.row_table is not None, "prepare_verify builds the rows' page tables"
            return paged_decode(
                q, k_cache, v_cache, meta.row_table, meta.seq_lens, None,
                scale=scale, backend="triton", validate=False,
            )  # fmt: skip
        if meta.plan is None:  # torch: one gather per sequence, its rows as SDPA query rows
            meta.plan = multi_query_plan(
                meta.page_table, meta.seq_lens, meta.num_rows, meta.longest,
                self.cfg.page_size, k_cache.shape[2], q.shape[1] // k_cache.shape[2],
            )  # fmt: skip
        return attend_multi_query(q, k_cache, v_cache, meta.plan, scale, self._workspace)

    def _select(self, q: Tensor, summary: PageSummary, meta: DecodeMetadata) -> SelectedPages:
        """A sparse layer's pages for this step, on the step's selection plan."""
        assert meta.budgets is not None, "a sparse layer's step has budgets"
        return select_pages(
            q,
            summary,
            meta.page_table,
            meta.seq_lens,
            meta.budgets,
            **self._rule,
            score=self.cfg.score,
            backend=self.cfg.backend,
            validate=False,
            plan=meta.selection,
        )

    def _dense_gathered(
        self, layer: int, q: Tensor, k: Tensor, v: Tensor, meta: DecodeMetadata
    ) -> Tensor:
        """A dense layer on the torch path: from the contiguous K/V copy when it is kept, else
        gathered from the pages on the step's dense gather plan."""
        k_cache, v_cache = self.k[layer], self.v[layer]

        def dense_plan() -> GatherPlan:  # the same rows and mask for every dense layer
            if meta.dense_plan is None:
                meta.dense_plan = gather_plan(
                    meta.page_table,
                    meta.seq_lens,
                    None,
                    self.cfg.page_size,
                    k_cache.shape[2],
                    num_slots=meta.page_table.shape[1],  # no sync for the longest row
                )
            return meta.dense_plan

        copy = self.dense_copy
        if copy is not None and copy.active:
            keys, values = copy.keys_values(
                layer, k, v, k_cache, v_cache, dense_plan, self._workspace
            )
            assert copy.bias is not None, "an active copy has this step's bias"
            return attend_gathered(q, keys, values, copy.bias, q.shape[-1] ** -0.5)
        return self._paged_decode(layer, q, meta, None, plan=dense_plan())

    def _paged_decode(
        self,
        layer: int,
        q: Tensor,
        meta: DecodeMetadata,
        selected: SelectedPages | None,
        plan: GatherPlan | None,
    ) -> Tensor:
        """Attention over the layer's cache: the `selected` pages, or every page (None)."""
        # validate=False: the runner builds page tables from the block manager and budgets of at
        # least num_sink + num_recent; the value checks would cost a device sync per layer.
        return paged_decode(
            q,
            self.k[layer],
            self.v[layer],
            meta.page_table,
            meta.seq_lens,
            selected,
            backend=self.cfg.backend,
            validate=False,
            plan=plan,
            workspace=self._workspace,
        )
