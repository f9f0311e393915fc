"""Waiting and running queues: which sequences run the next step, as a prefill or a decode batch.

Policy (nano-vllm's): a step is a prefill step whenever waiting sequences fit, else a decode step
over every running sequence. Fresh samples of the same prompt are prefilled as one group that
shares the prompt's full KV pages. When a decode step runs out of pages the youngest running
sequence is preempted: its pages are freed and it goes back to the front of the waiting queue, to
be recomputed by a prefill over its prompt + generated tokens. A request that cannot fit in the
pool even alone is refused when it is added. Tokens on the block manager's held prefix cost
neither pages nor prefill tokens: a group's prefill computes only those after it. Torch-free.
"""

from collections import deque
from dataclasses import dataclass
from itertools import islice

from sparrow.rollout.block_manager import BlockManager
from sparrow.rollout.sequence import Sequence, SequenceStatus


@dataclass
class PrefillBatch:
    groups: list[list[Sequence]]  # each group holds identical tokens; its K/V are computed once


@dataclass
class DecodeBatch:
    seqs: list[Sequence]  # every running sequence, oldest first; each has a slot for its token


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_batch_size: int, max_prefill_tokens: int):
        self.block_manager = block_manager
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        # The last sampled token is never cached, hence the - 1.
        max_cached = len(seq.prompt_ids) + seq.max_tokens - 1
        need = self.block_manager.pages_for_tokens(max_cached)
        if need > self.block_manager.num_pages:
            raise ValueError(
                f"request {seq.seq_id} needs up to {max_cached} cached tokens = {need} KV pages "
                f"(prompt {len(seq.prompt_ids)} + max_tokens {seq.max_tokens}), but the pool has "
                f"only {self.block_manager.num_pages} pages: raise num_pages or lower max_tokens"
            )
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def schedule(self) -> PrefillBatch | DecodeBatch:
        if self.is_finished():
            raise RuntimeError("nothing to schedule")
        prefill = self._schedule_prefill()
        return prefill if prefill is not None else self._schedule_decode()

    def finish(self, seq: Sequence, reason: str) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def abort(self) -> None:
        """Free the pages of every unfinished sequence (a failed call), leaving them unfinished."""
        for seq in self.running:
            self.block_manager.free(seq)
        self.running = []
        self.waiting.clear()

    def _schedule_prefill(self) -> PrefillBatch | None:
        bm = self.block_manager
        # Keep the pages running sequences need for their next decode step, so that admitting new
        # work does not force an immediate preemption.
        reserve = sum(bm.needs_page(s) for s in self.running)
        groups: list[list[Sequence]] = []
        num_tokens = 0
        while self.waiting and len(self.running) < self.max_batch_size:
            siblings = self._leading_group(self.max_batch_size - len(self.running))
            length = siblings[0].num_tokens
            cached = bm.cached_tokens(siblings[0])
            if groups and num_tokens + length - cached > self.max_prefill_tokens:
                break
            k = bm.max_group_size(length, len(siblings), reserve, cached)
            if k == 0:
                break
            group = [self.waiting.popleft() for _ in range(k)]
            bm.allocate_prefill(group)
            for seq in group:
                seq.status = SequenceStatus.RUNNING
            self.running.extend(group)
            groups.append(group)
            num_tokens += length - cached
        return PrefillBatch(groups) if groups else None

    def _leading_group(self, limit: int) -> list[Sequence]:
        """The head of the waiting queue plus its fresh siblings right behind it."""
        head = self.waiting[0]
        if not head.is_fresh:
            return [head]
        group = [head]
        for seq in islice(self.waiting, 1, limit):
            if seq.group_id != head.group_id or not seq.is_fresh:
                break
            group.append(seq)
        return group

    def _schedule_decode(self) -> DecodeBatch:
        bm = self.block_manager
        queue = deque(self.running)
        scheduled: list[Sequence] = []
        while queue:
            seq = queue.popleft()
            while bm.needs_page(seq) and bm.num_free_pages == 0:
                if queue:
                    self._preempt(queue.pop())
                else:
                    self._preempt(seq)
                    break
            else:
                if bm.needs_page(seq):
                    bm.append_page(seq)
                scheduled.append(seq)
        self.running = scheduled
        return DecodeBatch(list(scheduled))

    def preempt(self, seq: Sequence) -> None:
        """Free a running sequence's pages and queue it to be recomputed (a multi-turn episode
        whose observation finds no free page for its tokens)."""
        self.running.remove(seq)
        self._preempt(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
