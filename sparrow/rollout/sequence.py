"""Per-request state of the rollout engine: token ids, page table, status, why it stopped.

One `Sequence` is one sample: `n` samples of a prompt are `n` sequences with the same `group_id`.
Torch-free, so the block manager and scheduler that move sequences around are unit-tested in
milliseconds (tests/rollout/test_scheduler.py).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)  # no per-object dict: the decode plan reads every row's fields each step
class Sequence:
    seq_id: int  # position in the generate call's output order (prompt-major)
    group_id: int  # index of the prompt this sequence samples
    prompt_ids: list[int]  # prompt token ids
    max_tokens: int  # generation stops with "length" after this many completion tokens
    completion_ids: list[int] = field(default_factory=list)  # generated token ids so far
    status: SequenceStatus = SequenceStatus.WAITING
    page_table: list[int] = field(default_factory=list)  # physical page of each logical page
    finish_reason: str | None = None  # "eos" | "stop" | "length" once finished
    num_preemptions: int = 0  # times its pages were freed and its tokens recomputed
    # Leading tokens whose K/V already sat in cache pages when it was prefilled (the call's shared
    # prefix, a whole number of pages): its prefill computes only the tokens after them.
    num_cached_tokens: int = 0
    schedule: Callable[[int], int | None] | None = None  # context tokens -> pages; None: dense

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def is_fresh(self) -> bool:
        """No token generated yet: its whole context is the prompt, shareable with siblings."""
        return not self.completion_ids

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    @property
    def last_token_id(self) -> int:
        return self.completion_ids[-1] if self.completion_ids else self.prompt_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
