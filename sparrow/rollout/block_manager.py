"""The KV page pool: which physical pages are free, and how many sequences hold each one.

Samples of one prompt share the prompt's *full* pages (reference count = number of holders); the
partial last page of the prompt is private to each sample (its K/V are written once per sample),
because every sample appends its own tokens to it. Full pages are never written again, so no
copy-on-write is needed. Token t of a sequence lives at logical page t // page_size.

A generate call may also hold a *prefix* (`hold_prefix`): the whole pages of the tokens every one
of its prompts starts with, computed once. The call holds one reference on each prefix page and
every sequence whose tokens start with the prefix one more, so that the pages outlive preemptions
(a re-prefilled sequence takes them again) until the call releases them (`release_prefix`).
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
        self._prefix_ids: list[int] = []  # tokens of the held prefix (whole pages)
        self._prefix_pages: list[int] = []  # its physical pages, in order

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    def pages_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def prefill_cost(self, num_tokens: int, num_seqs: int, cached_tokens: int = 0) -> int:
        """New pages to prefill `num_seqs` sequences sharing the same `num_tokens` tokens, the
        first `cached_tokens` (whole pages) of which are on the held prefix's pages."""
        num_full, partial = divmod(num_tokens, self.page_size)
        return num_full - cached_tokens // self.page_size + num_seqs * (1 if partial else 0)

    def max_group_size(
        self, num_tokens: int, num_seqs: int, reserve: int = 0, cached_tokens: int = 0
    ) -> int:
        """How many of `num_seqs` siblings fit now, keeping `reserve` pages free (0 if none);
        the first `cached_tokens` are on the held prefix's pages and cost nothing."""
        free = self.num_free_pages - reserve
        num_full, partial = divmod(num_tokens, self.page_size)
        num_new_full = num_full - cached_tokens // self.page_size
        if free < num_new_full + (1 if partial else 0):
            return 0
        if not partial:
            return num_seqs
        return min(num_seqs, free - num_new_full)

    def hold_prefix(self, token_ids: list[int]) -> list[int]:
        """Take pages for `token_ids` (whole pages), held by the caller until `release_prefix`;
        sequences whose tokens start with them (and go on) share them. Returns the pages."""
        num_pages, partial = divmod(len(token_ids), self.page_size)
        if partial or num_pages == 0 or self._prefix_pages:
            raise ValueError("a prefix is one or more whole pages, and only one is held at once")
        if num_pages > self.num_free_pages:
            raise RuntimeError(f"prefix needs {num_pages} pages, {self.num_free_pages} free")
        self._prefix_ids = list(token_ids)
        self._prefix_pages = [self._take(1) for _ in range(num_pages)]
        return list(self._prefix_pages)

    def release_prefix(self) -> None:
        """Drop the caller's hold on the prefix pages (freed once no sequence holds them)."""
        self._release(self._prefix_pages)
        self._prefix_ids, self._prefix_pages = [], []

    def cached_tokens(self, seq: Sequence) -> int:
        """How many leading tokens of `seq` the held prefix covers: all of it when the sequence
        starts with it and has at least one token beyond it, else 0."""
        n = len(self._prefix_ids)
        if n == 0 or seq.num_tokens <= n or seq.prompt_ids[:n] != self._prefix_ids:
            return 0
        return n

    def allocate_prefill(self, group: list[Sequence]) -> None:
        """Give every sequence of `group` (identical tokens) pages for all its tokens: the held
        prefix's pages where its tokens start with the prefix, then new ones."""
        num_tokens = group[0].num_tokens
        assert all(s.token_ids == group[0].token_ids for s in group), "group must share tokens"
        assert all(not s.page_table for s in group), "sequence already holds pages"
        cached = self.cached_tokens(group[0])
        cost = self.prefill_cost(num_tokens, len(group), cached)
        if cost > self.num_free_pages:
            raise RuntimeError(f"prefill needs {cost} pages, {self.num_free_pages} free")
        num_full, partial = divmod(num_tokens, self.page_size)
        prefix = self._prefix_pages[: cached // self.page_size]
        for page in prefix:
            self._ref_counts[page] += len(group)
        shared = prefix + [self._take(len(group)) for _ in range(num_full - len(prefix))]
        for seq in group:
            seq.page_table = shared + ([self._take(1)] if partial else [])
            seq.num_cached_tokens = cached

    def needs_page(self, seq: Sequence) -> bool:
        """True when the sequence's newest token (the next one to cache) starts a new page."""
        return len(seq.page_table) < self.pages_for_tokens(seq.num_tokens)

    def append_page(self, seq: Sequence) -> None:
        if not self._free:
            raise RuntimeError("no free KV page")
        seq.page_table.append(self._take(1))

    def release_pages(self, seq: Sequence, keep: int) -> None:
        """Give back `seq`'s pages past its first `keep` (speculative drafts that were rejected)."""
        self._release(seq.page_table[keep:])
        del seq.page_table[keep:]

    def free(self, seq: Sequence) -> None:
        self._release(seq.page_table)
        seq.page_table = []

    def _release(self, pages: list[int]) -> None:
        for page in pages:
            self._ref_counts[page] -= 1
            if self._ref_counts[page] == 0:
                self._free.append(page)

    def ref_count(self, page: int) -> int:
        return self._ref_counts[page]

    def _take(self, holders: int) -> int:
        page = self._free.popleft()
        self._ref_counts[page] = holders
        return page
