"""The one place that turns scheduled sequences into tensors, then runs the model on them.

Holds the engine's copy of the weights (model.py) and its paged KV cache (paged_attention.py),
both allocated once. `prefill` takes groups of sequences with identical tokens (the samples of a
prompt, or one recomputed sequence): the tokens of each group go through the model once; the K/V
of full pages are written once into the group's shared pages and those of the partial last page
into every member's private page. Tokens already cached on a prefix's pages are not recomputed.
`decode` runs one token per sequence with the per-sequence budgets (None: dense); with an
unmerged LoRA set on the model, only the rows whose budget drops pages add its delta
(DistillSparse's gated mode). Run under torch.inference_mode.

Decode is planned, then run: the step's metadata comes from the persistent `DecodePlan`
(decode_plan.py, updated by what changed since the previous step), and the forward reads no
device value back, so that with `cuda_graphs` it is replayed from a graph captured per step
shape (cuda_graph.py; eager when an unmerged LoRA gates rows). The cache holds one page more
than the pool: the scratch page padding rows write to.
"""

import warnings

import torch
from torch import Tensor

from sparrow.kernels import uses_triton
from sparrow.kernels.selection import distinct_pages
from sparrow.rollout.cuda_graph import DecodeGraphs
from sparrow.rollout.decode_plan import DecodePlan, DecodeStep
from sparrow.rollout.linear import Linear
from sparrow.rollout.model import DecoderModel
from sparrow.rollout.paged_attention import (
    DecodeMetadata,
    PagedKVCache,
    PrefillMetadata,
    SparseAttentionConfig,
    VerifyMetadata,
)
from sparrow.rollout.sequence import Sequence
from sparrow.rollout.sleep import release_storages, restore_storages, return_memory


class ModelRunner:
    def __init__(
        self,
        hf_model,
        attn: SparseAttentionConfig,
        num_pages: int,
        dtype: torch.dtype,
        linear: Linear,
        *,
        cuda_graphs: bool = False,
        max_batch_size: int = 64,
    ):
        """`cuda_graphs`: replay decode from CUDA graphs (CUDA and the Triton backend only, else
        eager with a warning; it also pads shapes to buckets). `max_batch_size`: the plan's
        initial rows (it grows)."""
        self.device = next(hf_model.parameters()).device
        state = hf_model.state_dict()
        # The model's fused kernels follow the attention backend: Triton on CUDA (auto), and the
        # interpreter where a CPU run asks for the Triton backend (tests, the decode bench).
        triton_kernels = uses_triton(attn.backend, torch.empty(0, device=self.device))
        self.model = DecoderModel(
            hf_model.config, state, dtype, self.device, linear, triton_kernels=triton_kernels
        )
        self.page_size = attn.page_size
        self._cache_args = (attn, num_pages + 1, dtype)  # the last page: padding rows' scratch
        self._kv: PagedKVCache | None = self._new_cache()
        if cuda_graphs and (self.device.type != "cuda" or self.kv.dense_copy is not None):
            # A GPU config run on a CPU (tests, smoke runs) decodes eagerly, unpadded.
            warnings.warn(
                "cuda_graphs needs CUDA and the Triton backend: decoding eagerly", stacklevel=2
            )
            cuda_graphs = False
        self.cuda_graphs = cuda_graphs
        self.graphs = DecodeGraphs(self._forward) if cuda_graphs else None
        self._released: list | None = None  # sleep("weights"): the weight copy's storages
        self.weights_pending = False  # woken without weights: the next load must hold them all
        self.plan = DecodePlan(
            page_size=attn.page_size,
            num_sink=attn.num_sink,
            num_recent=attn.num_recent,
            scratch_page=num_pages,
            device=self.device,
            pad_shapes=cuda_graphs,
            column_multiple=16 if triton_kernels else 1,  # eager: no Triton re-specialising
            slots=max_batch_size,
        )

    def _new_cache(self) -> PagedKVCache:
        attn, num_pages, dtype = self._cache_args
        shape = self.model.shape
        return PagedKVCache(
            attn,
            num_layers=shape.num_layers,
            num_pages=num_pages,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype=dtype,
            device=self.device,
        )

    @property
    def kv(self) -> PagedKVCache:
        if self._kv is None:
            raise RuntimeError("the engine is asleep (its KV cache freed): wake it first")
        return self._kv

    @property
    def asleep(self) -> bool:
        return self._kv is None

    @property
    def sparse_settings(self):
        """The sparse attention's settings (page size, dense layers, page scoring)."""
        return self._cache_args[0]

    def sleep(self, weights: bool) -> None:
        """Free the KV cache (pool, page summaries, dense copies) and the decode graphs with
        their memory pool; with `weights` also the weight copy's storage (sleep.py)."""
        self._kv, self.graphs = None, None
        if weights and self._released is None:
            self._released = release_storages(self.model.weight_tensors())
            self.model.linear.clear()  # packed copies, keyed by the freed addresses
        return_memory(self.device)

    def wake(self) -> None:
        """Re-allocate what `sleep` freed: an empty cache (a new engine's), graphs re-captured
        per step shape as they are met; a freed weight copy is re-allocated unfilled, and
        `weights_pending` until a load holds every weight."""
        if self._kv is None:
            self._kv = self._new_cache()
            self.graphs = DecodeGraphs(self._forward) if self.cuda_graphs else None
        if self._released is not None:
            restore_storages(self._released)
            self._released, self.weights_pending = None, True

    def load_weights(self, buckets) -> None:
        """HF-named weight buckets copied in place, the packed copies rebuilt once after the
        last. Woken from sleep("weights"): re-allocated first, and the buckets must hold every
        weight (the freed copy's bytes are gone)."""
        if self._released is not None:
            self.wake()
        loaded: set[str] = set()
        for bucket in buckets:
            loaded |= self.model.load_state_dict(bucket, repack=False)
        self.model.repack()
        if self.weights_pending:
            missing = self.model.missing_weights(loaded)
            if missing:
                raise ValueError(
                    f"the engine slept with its weights released (rollout.engine.sleep=weights):"
                    f" the push after waking must hold every weight, it lacks {len(missing)}, "
                    f"e.g. {sorted(missing)[:3]}"
                )
            self.weights_pending = False

    def ensure_awake(self) -> None:
        """Before a generate or score: the cache re-allocated if asleep; refused while a freed
        weight copy has not been pushed again."""
        self.wake()
        if self.weights_pending:
            raise RuntimeError(
                "the engine slept with its weights released (rollout.engine.sleep=weights): "
                "push the actor's weights (update_weights) before generating"
            )

    @torch.inference_mode()
    def prefill(self, groups: list[list[Sequence]], update_summaries: bool) -> Tensor:
        """Logits (G, V) fp32 after the last token of each group. A group whose sequences have
        `num_cached_tokens` C > 0 (a prefix on their first pages) computes only tokens C.., which
        attend to the cached K/V of the first C. `update_summaries`: keep the sparse layers'
        page summaries of the pages written current (needed when a schedule is set)."""
        ps = self.page_size
        ids, kv_rows, slots, page_ids, fills = [], [], [], [], []
        positions, contexts, bounds, last_rows, start = [], [], [], [], 0
        for group in groups:
            tokens = group[0].token_ids
            length = len(tokens)
            cached = group[0].num_cached_tokens  # whole pages already in the cache (a prefix)
            first, num_full = cached // ps, length // ps
            shared = num_full * ps  # tokens on pages every member of the group holds
            new = length - cached  # tokens this prefill computes
            table = torch.tensor(group[0].page_table[:num_full], dtype=torch.int64)  # (F,)
            rows = torch.arange(cached, shared)  # token index of each new token on a full page
            ids.append(torch.tensor(tokens[cached:], dtype=torch.int64))
            positions.append(torch.arange(cached, length))  # (new,)
            kv_rows.append(start + rows - cached)
            slots.append(table[rows // ps] * ps + rows % ps)
            page_ids.append(table[first:])
            fills.append(torch.full((num_full - first,), ps, dtype=torch.int64))
            if length > shared:
                tail = torch.arange(length - shared)  # offsets in the partial page
                for seq in group:
                    page = seq.page_table[num_full]
                    kv_rows.append(start + shared - cached + tail)
                    slots.append(page * ps + tail)
                    page_ids.append(torch.tensor([page]))
                    fills.append(torch.tensor([length - shared]))
            context = (table[:first, None] * ps + torch.arange(ps)).reshape(-1)  # (cached,)
            contexts.append(self._to(context) if cached else None)
            bounds.append((start, start + new))
            last_rows.append(start + new - 1)
            start += new
        written = (torch.cat(kv_rows), torch.cat(slots), torch.cat(page_ids), torch.cat(fills))
        return self._run_prefill(
            ids, positions, bounds, torch.tensor(last_rows), written, contexts, update_summaries
        )

    @torch.inference_mode()
    def extend(self, seqs: list[Sequence], num_new: list[int], update_summaries: bool) -> Tensor:
        """A multi-turn episode's next chunk (rollout/episodes.py): the last num_new[i] tokens of
        each sequence (the closing token of its turn and the observation after it) computed
        onto its cached K/V at their true positions, as `verify` computes drafts; logits (B, V)
        fp32 after each sequence's last token only."""
        return self.verify(seqs, num_new, update_summaries, last_only=True)

    @torch.inference_mode()
    def verify(
        self,
        seqs: list[Sequence],
        num_new: list[int],
        update_summaries: bool,
        last_only: bool = False,
    ) -> Tensor:
        """The dense pass of speculative decoding: logits (sum(num_new), V) fp32 at each of the
        last num_new[i] tokens of each sequence (its last cached token and its drafts), which
        attend densely to the cached K/V before them and causally to each other (`last_only`:
        at each sequence's last token only, (S, V)). Their K/V are written again: the drafts'
        were computed under sparse attention, and from the first sparse layer on they differ
        from the dense ones the accepted tokens must keep. Decode-shaped: each row reads its
        sequence's pages in place (`PagedKVCache.verify_attention`), where the prefill path
        gathered and concatenated each sequence's whole context per layer (2.8 dense decode
        steps for 4 rows at 2K context; docs/speculative/README.md has the figures)."""
        ps = self.page_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        page_ids: list[int] = []
        fills: list[int] = []
        width = max(len(seq.page_table) for seq in seqs)
        pad = self.kv.num_pages - 1  # the scratch page: never read (past every row's length)
        tables = [seq.page_table + [pad] * (width - len(seq.page_table)) for seq in seqs]
        for seq, table, new in zip(seqs, tables, num_new, strict=True):
            length = seq.num_tokens
            cached = length - new  # tokens before the verified ones, whose K/V stand
            ids += seq.token_ids[cached:]
            positions += range(cached, length)
            slots += [table[t // ps] * ps + t % ps for t in range(cached, length)]
            for page in range(cached // ps, (length - 1) // ps + 1):
                page_ids.append(table[page])
                fills.append(min(ps, length - page * ps))
        starts = [0]
        for new in num_new:
            starts.append(starts[-1] + new)
        meta = VerifyMetadata(
            slot_mapping=self._to(torch.tensor(slots, dtype=torch.int64)),
            page_table=self._to(torch.tensor(tables, dtype=torch.int32)),
            query_starts=self._to(torch.tensor(starts, dtype=torch.int32)),
            seq_lens=self._to(torch.tensor(positions, dtype=torch.int32) + 1),
            num_rows=list(num_new),
            longest=max(positions) + 1,
        )
        self.kv.prepare_verify(meta)
        last = self._to(torch.tensor(starts[1:]) - 1) if last_only else None
        logits = self.model.verify(
            self._to(torch.tensor(ids, dtype=torch.int64)),
            self._to(torch.tensor(positions, dtype=torch.int64)),
            last,
            self.kv,
            meta,
        )
        if update_summaries:
            self.kv.update_summaries(
                self._to(torch.tensor(page_ids, dtype=torch.int64)),
                self._to(torch.tensor(fills, dtype=torch.int64)),
            )
        return logits

    def _run_prefill(
        self,
        ids: list[Tensor],
        positions: list[Tensor],
        bounds: list[tuple[int, int]],
        logit_rows: Tensor,
        written: tuple[Tensor, Tensor, Tensor, Tensor],
        contexts: list[Tensor | None],
        update_summaries: bool,
    ) -> Tensor:
        """The model over the concatenated new tokens of each group -> logits at `logit_rows`;
        `written`: (rows whose K/V are written, their cache slots, the pages written, their
        fills), host tensors; `contexts`: each group's cached context slots (device) or None."""
        kv_rows, slots, page_ids, fills = written
        meta = PrefillMetadata(
            kv_rows=self._to(kv_rows),
            slot_mapping=self._to(slots),
            page_ids=self._to(page_ids),
            fill_counts=self._to(fills),
            context_slots=contexts if any(c is not None for c in contexts) else None,
        )
        logits = self.model.prefill(
            self._to(torch.cat(ids)),
            self._to(torch.cat(positions)),
            bounds,
            self._to(logit_rows),
            self.kv,
            meta,
        )
        if update_summaries:
            self.kv.update_summaries(meta.page_ids, meta.fill_counts)
        return logits

    @torch.inference_mode()
    def decode(
        self, seqs: list[Sequence], budgets: list[int] | None, update_summaries: bool
    ) -> Tensor:
        """One step for every sequence (its last token is fed); logits (B, V) fp32.
        `budgets`: pages per sparse layer for each sequence, or None for a dense step. With CUDA
        graphs the logits are the graph's output buffer: valid until the next step."""
        step = self.plan.update(seqs, budgets)
        lens = step.rows[5]  # (B,) device copy of the lengths, for CPU-only plan parts
        num_rows, batch = step.num_rows, step.page_table.shape[0]
        if self.kv.dense_copy is not None:
            pad = batch - num_rows
            ids = [s.seq_id for s in seqs] + [-1] * pad
            self.kv.begin_decode(ids, [s.num_tokens for s in seqs] + [1] * pad)
        gate = self._lora_gate(seqs, budgets, batch)
        if self.graphs is not None and gate is None:
            logits = self.graphs(step)
        else:
            distinct = None
            if step.sparse and self.kv.dedupes_scoring:
                distinct = _shared_split(step.page_table, lens, self.page_size)
            shared = self.kv.reads_shared_pages and _rows_share_pages(seqs)
            logits = self._forward(step, gate, shared, distinct)
        if update_summaries and not self.kv.writes_decode_summaries:
            self.kv.update_summaries(step.rows[3], step.rows[4])
        return logits[:num_rows]

    def _forward(
        self,
        step: DecodeStep,
        gate: Tensor | None = None,
        shared_pages: bool = False,
        distinct: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """The decode forward of a planned step -> logits (B, V) fp32: what a CUDA graph
        captures. Reads no device value back to the host."""
        input_ids, positions, slot_mapping, last_page, last_fill, lens, budgets = step.rows
        meta = DecodeMetadata(
            slot_mapping=slot_mapping,
            page_table=step.page_table,
            seq_lens=lens.to(torch.int32),
            last_page_ids=last_page,
            last_page_fill=last_fill,
            budgets=budgets.to(torch.int32) if step.sparse else None,
            max_selected=step.max_selected,
            max_top=step.max_top,
            shared_pages=shared_pages,
            distinct=distinct,
        )
        self.kv.prepare_decode(meta)
        return self.model.decode(input_ids, positions, self.kv, meta, gate)

    def _lora_gate(
        self, seqs: list[Sequence], budgets: list[int] | None, batch: int
    ) -> Tensor | None:
        """(batch,) 1 where the step is sparse (budget < ceil(context / PAGE), the input token
        included), else 0 (padding rows too); None when no LoRA is set or no row is sparse.
        Built from host lists, so it costs no device sync."""
        if self.model.lora is None or budgets is None:
            return None
        ps = self.page_size
        sparse = [b < -(-s.num_tokens // ps) for s, b in zip(seqs, budgets, strict=True)]
        if not any(sparse):
            return None
        sparse += [False] * (batch - len(seqs))
        return self._to(torch.tensor(sparse, dtype=self.model.dtype))

    def _to(self, t: Tensor) -> Tensor:
        return t.to(self.device, non_blocking=True)


def _shared_split(page_table: Tensor, lens: Tensor, page_size: int) -> tuple[Tensor, Tensor] | None:
    """The distinct-page split of a CPU step's page table when the rows share enough pages (the
    distinct ids are at most half the entries), else None; see selection.distinct_pages."""
    distinct, column = distinct_pages(page_table, lens, page_size)
    return (distinct, column) if 2 * distinct.numel() <= page_table.numel() else None


def _rows_share_pages(seqs: list[Sequence]) -> bool:
    """Whether the rows reference each of their physical pages twice or more on average (samples
    of one prompt); from host lists, no device sync."""
    pages = [p for s in seqs for p in s.page_table]  # shared pages repeated
    return 2 * len(set(pages)) <= len(pages)
