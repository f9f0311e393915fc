"""The KV page pool: which physical pages are free, and how many sequences hold each one.

Samples of one prompt share the prompt's *full* pages (reference count = number of holders); the
partial last page of the prompt is private to each sample (its K/V are written once per sample),
because every sample appends its own tokens to it. Full pages are never written again, so no
copy-on-write is needed. Token t of a sequence lives at logical page t // page_size.
Torch-free: the engine's model runner turns page tables into tensors.
"""

from collections import deque

from sparrow.rollout.sequence import Sequence


class BlockManager:
    def __init__(self, num_pages: int, page_size: int):
        if num_pages < 1 or page_size < 1:
            raise ValueError(
                f"need num_pages >= 1 and page_size >= 1, got {num_pages}, {page_size}"
            )
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: deque[int] = deque(range(num_pages))
        self._ref_counts = [0] * num_pages

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    def pages_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def prefill_cost(self, num_tokens: int, num_seqs: int) -> int:
        """Pages to prefill `num_seqs` sequences sharing the same `num_tokens` tokens."""
        num_full, partial = divmod(num_tokens, self.page_size)
        return num_full + num_seqs * (1 if partial else 0)

    def max_group_size(self, num_tokens: int, num_seqs: int, reserve: int = 0) -> int:
        """How many of `num_seqs` siblings fit now, keeping `reserve` pages free (0 if none)."""
        free = self.num_free_pages - reserve
        num_full, partial = divmod(num_tokens, self.page_size)
        if free < num_full + (1 if partial else 0):
            return 0
        if not partial:
            return num_seqs
        return min(num_seqs, free - num_full)

    def allocate_prefill(self, group: list[Sequence]) -> None:
        """Give every sequence of `group` (identical tokens) pages for all its tokens."""
        num_tokens = group[0].num_tokens
        assert all(s.token_ids == group[0].token_ids for s in group), "group must share tokens"
        assert all(not s.page_table for s in group), "sequence already holds pages"
        cost = self.prefill_cost(num_tokens, len(group))
        if cost > self.num_free_pages:
            raise RuntimeError(f"prefill needs {cost} pages, {self.num_free_pages} free")
        num_full, partial = divmod(num_tokens, self.page_size)
        shared = [self._take(len(group)) for _ in range(num_full)]
        for seq in group:
            seq.page_table = shared + ([self._take(1)] if partial else [])

    def needs_page(self, seq: Sequence) -> bool:
        """True when the sequence's newest token (the next one to cache) starts a new page."""
        return len(seq.page_table) < self.pages_for_tokens(seq.num_tokens)

    def append_page(self, seq: Sequence) -> None:
        if not self._free:
            raise RuntimeError("no free KV page")
        seq.page_table.append(self._take(1))

    def free(self, seq: Sequence) -> None:
        for page in seq.page_table:
            self._ref_counts[page] -= 1
            if self._ref_counts[page] == 0:
                self._free.append(page)
        seq.page_table = []

    def ref_count(self, page: int) -> int:
        return self._ref_counts[page]

    def _take(self, holders: int) -> int:
        page = self._free.popleft()
        self._ref_counts[page] = holders
        return page
