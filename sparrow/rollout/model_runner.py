"""The one place that turns scheduled sequences into tensors, then runs the model on them.

Holds the engine's copy of the weights (model.py) and its paged KV cache (paged_attention.py),
both allocated once. `prefill` takes groups of sequences with identical tokens (the samples of a
prompt, or one recomputed sequence): the tokens of each group go through the model once; the K/V
of full pages are written once into the group's shared pages and those of the partial last page
into every member's private page. `decode` runs one token per sequence with the per-sequence
budgets (None: dense); with an unmerged LoRA set on the model, only the rows whose budget drops
pages add its delta (DistillSparse's gated mode). Run under torch.inference_mode.
"""

import torch
from torch import Tensor

from sparrow.rollout.linear import Linear
from sparrow.rollout.model import DecoderModel
from sparrow.rollout.paged_attention import (
    DecodeMetadata,
    PagedKVCache,
    PrefillMetadata,
    SparseAttentionConfig,
)
from sparrow.rollout.sequence import Sequence


class ModelRunner:
    def __init__(
        self,
        hf_model,
        attn: SparseAttentionConfig,
        num_pages: int,
        dtype: torch.dtype,
        linear: Linear,
    ):
        self.device = next(hf_model.parameters()).device
        state = hf_model.state_dict()
        self.model = DecoderModel(hf_model.config, state, dtype, self.device, linear)
        shape = self.model.shape
        self.page_size = attn.page_size
        self.kv = PagedKVCache(
            attn,
            num_layers=shape.num_layers,
            num_pages=num_pages,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype=dtype,
            device=self.device,
        )

    @torch.inference_mode()
    def prefill(self, groups: list[list[Sequence]], update_summaries: bool) -> Tensor:
        """Logits (G, V) fp32 after the last token of each group. `update_summaries`: keep the
        sparse layers' page summaries current (needed when a schedule is set)."""
        ps = self.page_size
        ids, kv_rows, slots, page_ids, fills = [], [], [], [], []
        bounds, last_rows, start = [], [], 0
        for group in groups:
            tokens = group[0].token_ids
            length = len(tokens)
            num_full = length // ps
            shared = num_full * ps  # tokens on pages every member of the group holds
            table = torch.tensor(group[0].page_table[:num_full], dtype=torch.int64)  # (F,)
            rows = torch.arange(shared)  # (F * PAGE,)
            ids.append(torch.tensor(tokens, dtype=torch.int64))
            kv_rows.append(start + rows)
            slots.append(table[rows // ps] * ps + rows % ps)
            page_ids.append(table)
            fills.append(torch.full((num_full,), ps, dtype=torch.int64))
            if length > shared:
                tail = torch.arange(length - shared)  # offsets in the partial page
                for seq in group:
                    page = seq.page_table[num_full]
                    kv_rows.append(start + shared + tail)
                    slots.append(page * ps + tail)
                    page_ids.append(torch.tensor([page]))
                    fills.append(torch.tensor([length - shared]))
            bounds.append((start, start + length))
            last_rows.append(start + length - 1)
            start += length
        positions = torch.cat([torch.arange(b - a) for a, b in bounds])  # (N,)
        meta = PrefillMetadata(
            kv_rows=self._to(torch.cat(kv_rows)),
            slot_mapping=self._to(torch.cat(slots)),
            page_ids=self._to(torch.cat(page_ids)),
            fill_counts=self._to(torch.cat(fills)),
        )
        logits = self.model.prefill(
            self._to(torch.cat(ids)),
            self._to(positions),
            bounds,
            self._to(torch.tensor(last_rows)),
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
        `budgets`: pages per sparse layer for each sequence, or None for a dense step."""
        ps = self.page_size
        max_pages = max(len(s.page_table) for s in seqs)
        # Padding entries are never read (masked by seq_lens) but must be valid page ids.
        table = [s.page_table + [0] * (max_pages - len(s.page_table)) for s in seqs]
        page_table = torch.tensor(table, dtype=torch.int32)  # (B, max_pages)
        lengths = [s.num_tokens for s in seqs]
        seq_lens = torch.tensor(lengths, dtype=torch.int64)  # (B,)
        positions = seq_lens - 1  # (B,) the fed token's position
        last_page = page_table.gather(1, (positions // ps)[:, None])[:, 0].long()  # (B,)
        offset = positions % ps  # (B,)
        meta = DecodeMetadata(
            slot_mapping=self._to(last_page * ps + offset),
            page_table=self._to(page_table),
            seq_lens=self._to(seq_lens.int()),
            last_page_ids=self._to(last_page),
            last_page_fill=self._to(offset + 1),
            budgets=None if budgets is None else self._to(torch.tensor(budgets, dtype=torch.int32)),
            shared_pages=self.kv.reads_shared_pages and _rows_share_pages(seqs),
        )
        input_ids = torch.tensor([s.last_token_id for s in seqs], dtype=torch.int64)
        gate = self._lora_gate(seqs, budgets)
        self.kv.begin_decode([s.seq_id for s in seqs], lengths)
        logits = self.model.decode(self._to(input_ids), self._to(positions), self.kv, meta, gate)
        if update_summaries:
            self.kv.update_summaries(meta.last_page_ids, meta.last_page_fill)
        return logits

    def _lora_gate(self, seqs: list[Sequence], budgets: list[int] | None) -> Tensor | None:
        """(B,) 1 where the step is sparse (budget < ceil(context / PAGE), the input token
        included), else 0; None when no LoRA is set or no row is sparse. Built from host lists,
        so it costs no device sync."""
        if self.model.lora is None or budgets is None:
            return None
        ps = self.page_size
        sparse = [b < -(-s.num_tokens // ps) for s, b in zip(seqs, budgets, strict=True)]
        if not any(sparse):
            return None
        return self._to(torch.tensor(sparse, dtype=self.model.dtype))

    def _to(self, t: Tensor) -> Tensor:
        return t.to(self.device, non_blocking=True)


def _rows_share_pages(seqs: list[Sequence]) -> bool:
    """Whether the rows reference each of their physical pages twice or more on average (samples
    of one prompt); from host lists, no device sync."""
    pages = [p for s in seqs for p in s.page_table]  # shared pages repeated
    return 2 * len(set(pages)) <= len(pages)
