"""The decode plan: the persistent device tensors one decode step reads, updated incrementally.

FlashInfer's plan/run split: the step's metadata is built once, before the forward, and every
layer only reads it. The page tables of the running sequences live in one device table with a
row ("slot") per sequence for its whole life; a step writes only the entries that changed since
the previous one (new pages, or the whole row of a sequence new to the table), so the cost
follows what changed, not batch x pages (the old per-step rebuild from Python lists took 47.5 ms
at 256 sequences x 2K pages). The per-row values (token, position, cache slot, length, budget)
travel in one packed host-to-device copy, pinned and non-blocking on CUDA; the step's page table
is one device gather of its rows' slots.

With `pad_shapes` the batch, the page columns and the selection counts are rounded up to buckets
(`bucket`), so that consecutive steps repeat their shapes and a captured CUDA graph can replay
them. Padding rows decode a one-token sequence on a scratch page that no sequence owns; their
outputs are dropped. Without it (eager decode), `column_multiple` still rounds the page columns
and the selection counts up to a multiple: Triton specialises a kernel on whether each integer
argument and stride is divisible by 16 and on its pointers' 16-byte alignment, so an eager step
whose width changed parity compiled new variants mid-generation; the runner sets 16 when its
kernels are Triton's. `min_columns` fixes a floor on the width (a benchmark's steps then all
share one shape). Torch-free bookkeeping apart from the tensors themselves.
"""

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from sparrow.rollout.sequence import Sequence

# Rows of the packed per-row tensor, in order.
ROW_FIELDS = ("input_ids", "positions", "slot_mapping", "last_page", "last_fill", "lens", "budgets")


def bucket(n: int) -> int:
    """n rounded up to 1, 2, 4, 8, then 4 steps per octave (10, 12, 14, 16, 20, 24, ...): shapes
    repeat across steps and padding wastes at most 25%."""
    if n <= 8:
        return 1 << max(n - 1, 0).bit_length()
    step = 1 << ((n - 1).bit_length() - 3)
    return -(-n // step) * step


@dataclass
class DecodeStep:
    """One decode step's inputs, as the forward reads them."""

    rows: Tensor  # (7, B) int64 on the device, see ROW_FIELDS
    page_table: Tensor  # (B, P) int32 physical page of each logical page; padding: valid ids
    num_rows: int  # real sequences; rows past it are padding
    sparse: bool  # whether budgets apply (else every layer is dense)
    max_selected: int  # upper bound on any row's kept pages (sparse steps)
    max_top: int  # upper bound on any row's pages chosen by score (sparse steps)

    @property
    def shape_key(self) -> tuple:
        """What a captured graph is specialised to."""
        b, p = self.page_table.shape
        return (b, p, self.sparse, self.max_selected, self.max_top)


class DecodePlan:
    def __init__(
        self,
        *,
        page_size: int,
        num_sink: int,
        num_recent: int,
        scratch_page: int,
        device: torch.device,
        pad_shapes: bool = False,
        column_multiple: int = 1,
        slots: int = 64,
        columns: int = 64,
    ):
        self.page_size = page_size
        self.floor = num_sink + num_recent
        self.num_sink = num_sink
        self.scratch_page = scratch_page  # page no sequence owns: padding rows write there
        self.device = device
        self.pad_shapes = pad_shapes
        self.column_multiple = column_multiple  # unpadded steps: columns, counts rounded up to it
        self.min_columns = 0  # every step's page table is at least this wide
        self._pin = device.type == "cuda"
        # Row `slots` (the last) is the padding row: every entry is the scratch page.
        shape = (slots + 1, columns)
        self.table = torch.full(shape, scratch_page, dtype=torch.int32, device=device)  # (S+1, P)
        self._owner: list[Sequence | None] = [None] * slots
        self._epoch = [0] * slots  # the owner's num_preemptions when its row was written
        self._known = [0] * slots  # entries of the row written so far
        self._slot_of: dict[int, int] = {}  # id(sequence) -> slot
        self._free = list(range(slots - 1, -1, -1))
        self.last_update_entries = 0  # table entries written by the latest `update`

    @property
    def pad_slot(self) -> int:
        return self.table.shape[0] - 1

    def update(self, seqs: list[Sequence], budgets: list[int] | None) -> DecodeStep:
        """The step for `seqs` (each with a page for its input token) and their page budgets
        (None: dense). Frees the slots of sequences no longer decoded.

        One pass over the sequences collects both the table entries that changed and the
        per-row values: at 256 sequences the step's cost is this Python loop (~2 us a row), so
        it reads each sequence's fields once."""
        keys = [id(s) for s in seqs]
        slot_of = self._slot_of
        known_slots = [slot_of.get(k) for k in keys]
        if len(slot_of) > len(keys) - known_slots.count(None):
            live = set(keys)  # some slots belong to sequences no longer decoded
            for key in [k for k in slot_of if k not in live]:
                self._release(slot_of.pop(key))
        if len(seqs) > len(self._owner):
            self._grow(rows=len(seqs))
        ps = self.page_size
        known, epoch = self._known, self._epoch
        slots, tokens, lens, last_page = [], [], [], []
        rows: list[int] = []
        cols: list[int] = []
        pages: list[int] = []
        longest = 0
        for seq, slot in zip(seqs, known_slots, strict=True):
            if slot is None or epoch[slot] != seq.num_preemptions:
                slot = self._assign(seq, slot)
            table_row = seq.page_table
            n, written = len(table_row), known[slot]
            if n != written:
                if n < written:  # pages were replaced under the same sequence: rewrite the row
                    written = 0
                rows += [slot] * (n - written)
                cols += range(written, n)
                pages += table_row[written:n]
                known[slot] = n
            if n > longest:
                longest = n
            num_tokens = seq.num_tokens
            slots.append(slot)
            tokens.append(seq.last_token_id)
            lens.append(num_tokens)
            last_page.append(table_row[(num_tokens - 1) // ps])
        if max(longest, self.min_columns) > self.table.shape[1]:
            self._grow(columns=max(longest, self.min_columns))
        self.last_update_entries = len(pages)
        if pages:
            entries = self._host([rows, cols, pages])  # (3, E)
            self.table[entries[0], entries[1]] = entries[2].to(torch.int32)
        return self._step(budgets, slots, tokens, lens, last_page, longest)

    def _step(
        self,
        budgets: list[int] | None,
        slots: list[int],
        tokens: list[int],
        lens: list[int],
        last_page: list[int],
        longest: int,
    ) -> DecodeStep:
        ps, num = self.page_size, len(slots)
        batch = bucket(num) if self.pad_shapes else num
        wide = max(longest, self.min_columns)
        columns = min(bucket(wide) if self.pad_shapes else self._round(wide), self.table.shape[1])
        pad = batch - num
        positions = np.asarray(lens, dtype=np.int64) - 1  # (num,)
        fill = positions % ps + 1
        packed = np.empty((8, batch), dtype=np.int64)
        packed[:, num:] = np.array(
            [0, 0, self.scratch_page * ps, self.scratch_page, 1, 1, self.floor, self.pad_slot]
        )[:, None]  # padding rows: a one-token sequence on the scratch page
        packed[0, :num] = tokens
        packed[1, :num] = positions
        packed[3, :num] = last_page
        packed[2, :num] = packed[3, :num] * ps + fill - 1
        packed[4, :num] = fill
        packed[5, :num] = lens
        packed[6, :num] = budgets if budgets is not None else 0
        packed[7, :num] = slots
        rows = self._to_device(torch.from_numpy(packed))  # (8, B)
        if pad == 0 and slots == list(range(num)):
            # Rows in slot order (the steady state: no sequence finished since the slots were
            # handed out): the table's leading rows are the step's table, no copy. Later
            # updates write in place, after this step's forward in stream order.
            table = self.table[:num, :columns]  # (B, P) view
        else:
            table = self.table[:, :columns].index_select(0, rows[7])  # (B, P)
        max_selected = max_top = 0
        if budgets is not None:
            pages = [-(-n // ps) for n in lens]
            kept = [min(b, p) for b, p in zip(budgets, pages, strict=True)]
            top = [b - self.floor if p > b else 0 for b, p in zip(budgets, pages, strict=True)]
            max_selected, max_top = max(kept), max(top)
            up = bucket if self.pad_shapes else self._round
            max_selected = min(up(max_selected), columns)
            max_top = min(up(max_top), columns) if max_top else 0
        return DecodeStep(
            rows=rows[:7],
            page_table=table,
            num_rows=num,
            sparse=budgets is not None,
            max_selected=max_selected,
            max_top=max_top,
        )

    def _round(self, n: int) -> int:
        """n rounded up to a multiple of `column_multiple`."""
        return -(-n // self.column_multiple) * self.column_multiple

    def _host(self, values: list[list[int]]) -> Tensor:
        """One (len(values), n) int64 device tensor from host lists (numpy converts lists of
        ints ~3x faster than torch.tensor)."""
        return self._to_device(torch.from_numpy(np.array(values, dtype=np.int64)))

    def _to_device(self, t: Tensor) -> Tensor:
        """A single copy, from pinned memory and non-blocking on CUDA."""
        if self._pin:
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def _assign(self, seq: Sequence, stale: int | None) -> int:
        if stale is not None:
            self._release(stale)
        if not self._free:
            self._grow(rows=2 * len(self._owner))
        slot = self._free.pop()
        self._owner[slot] = seq
        self._epoch[slot] = seq.num_preemptions
        self._known[slot] = 0
        self._slot_of[id(seq)] = slot
        return slot

    def _release(self, slot: int) -> None:
        self._owner[slot] = None
        self._known[slot] = 0
        self._free.append(slot)

    def _grow(self, rows: int = 0, columns: int = 0) -> None:
        """Reallocate the table with room for `rows` sequences and `columns` pages (doubling)."""
        old_slots = len(self._owner)
        new_slots = max(old_slots, rows)
        new_cols = self.table.shape[1]
        while new_cols < columns:
            new_cols *= 2
        table = torch.full(
            (new_slots + 1, new_cols), self.scratch_page, dtype=torch.int32, device=self.device
        )
        table[:old_slots, : self.table.shape[1]] = self.table[:old_slots]
        self.table = table
        added = new_slots - old_slots
        self._owner += [None] * added
        self._epoch += [0] * added
        self._known += [0] * added
        self._free = list(range(new_slots - 1, old_slots - 1, -1)) + self._free
