"""Block manager + scheduler, driven by a fake step loop (no torch, no model): milliseconds."""

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.rollout.block_manager import BlockManager
from sparrow.rollout.scheduler import DecodeBatch, PrefillBatch, Scheduler
from sparrow.rollout.sequence import Sequence, SequenceStatus


def make_seqs(prompt_lens, n, max_tokens):
    seqs = []
    for g, length in enumerate(prompt_lens):
        for _ in range(n):
            prompt = [100 + g] * length
            seqs.append(Sequence(len(seqs), g, prompt, max_tokens))
    return seqs


def run_to_completion(sched, seqs, max_steps=10_000):
    """The engine's loop without a model: each scheduled sequence gets one token per step."""
    for seq in seqs:
        sched.add(seq)
    steps = []
    while not sched.is_finished():
        batch = sched.schedule()
        steps.append(batch)
        batch_seqs = (
            [s for g in batch.groups for s in g] if isinstance(batch, PrefillBatch) else batch.seqs
        )
        assert len(batch_seqs) <= sched.max_batch_size
        for seq in batch_seqs:
            # Every token but the newest must be in the cache: pages cover num_tokens.
            assert len(seq.page_table) == sched.block_manager.pages_for_tokens(seq.num_tokens)
            seq.completion_ids.append(seq.seq_id)
            if len(seq.completion_ids) == seq.max_tokens:
                sched.finish(seq, "length")
        assert len(steps) < max_steps
    return steps


def test_siblings_share_full_prompt_pages_and_copy_the_partial_one():
    bm = BlockManager(num_pages=64, page_size=4)
    sched = Scheduler(bm, max_batch_size=8, max_prefill_tokens=1024)
    seqs = make_seqs([10], n=3, max_tokens=5)  # 2 full pages + a partial one of 2 tokens
    for s in seqs:
        sched.add(s)
    batch = sched.schedule()
    assert isinstance(batch, PrefillBatch) and [len(g) for g in batch.groups] == [3]
    tables = [s.page_table for s in seqs]
    assert tables[0][:2] == tables[1][:2] == tables[2][:2]
    assert len({t[2] for t in tables}) == 3
    assert bm.ref_count(tables[0][0]) == 3 and bm.ref_count(tables[0][2]) == 1
    assert bm.num_free_pages == 64 - 2 - 3
    sched.finish(seqs[0], "eos")
    assert bm.ref_count(tables[1][0]) == 2 and bm.num_free_pages == 64 - 2 - 2


def test_page_aligned_prompt_shares_every_page():
    bm = BlockManager(num_pages=16, page_size=4)
    sched = Scheduler(bm, max_batch_size=8, max_prefill_tokens=1024)
    seqs = make_seqs([8], n=4, max_tokens=3)
    for s in seqs:
        sched.add(s)
    sched.schedule()
    assert bm.num_free_pages == 16 - 2
    for s in seqs:  # the first generated token opens a private page per sample
        s.completion_ids.append(1)
    batch = sched.schedule()
    assert isinstance(batch, DecodeBatch) and len(batch.seqs) == 4
    assert bm.num_free_pages == 16 - 2 - 4


def test_everything_completes_and_pages_return():
    bm = BlockManager(num_pages=256, page_size=4)
    sched = Scheduler(bm, max_batch_size=4, max_prefill_tokens=64)
    seqs = make_seqs([3, 9, 17, 4, 30], n=2, max_tokens=7)
    steps = run_to_completion(sched, seqs)
    assert all(s.status is SequenceStatus.FINISHED and len(s.completion_ids) == 7 for s in seqs)
    assert bm.num_free_pages == 256 and sched.num_preemptions == 0
    prefills = [b for b in steps if isinstance(b, PrefillBatch)]
    for b in prefills:  # the token cap holds unless a single group exceeds it
        lengths = [g[0].num_tokens for g in b.groups]
        assert len(lengths) == 1 or sum(lengths) <= 64


def test_small_pool_preempts_youngest_and_still_completes():
    bm = BlockManager(num_pages=12, page_size=4)
    sched = Scheduler(bm, max_batch_size=8, max_prefill_tokens=1024)
    seqs = make_seqs([6, 6, 6, 6], n=2, max_tokens=20)  # alone: 25 tokens = 7 pages
    run_to_completion(sched, seqs)
    assert sched.num_preemptions > 0
    assert all(len(s.completion_ids) == 20 for s in seqs)
    assert bm.num_free_pages == 12
    # Preempted sequences kept their tokens: the fake model wrote seq_id at every step.
    assert all(s.completion_ids == [s.seq_id] * 20 for s in seqs)


def test_preemption_takes_the_youngest():
    bm = BlockManager(num_pages=4, page_size=2)
    sched = Scheduler(bm, max_batch_size=8, max_prefill_tokens=1024)
    old, young = Sequence(0, 0, [1, 2], 6), Sequence(1, 1, [3, 4], 6)
    for s in (old, young):
        sched.add(s)
    sched.schedule()  # both prefilled: one page each
    for s in (old, young):
        s.completion_ids.append(9)
    sched.schedule()  # each opens its second page: pool full
    for s in (old, young):
        s.completion_ids.append(9)
    sched.schedule()  # each has 4 cached tokens; no one needs a page yet
    for s in (old, young):
        s.completion_ids.append(9)
    batch = sched.schedule()  # both need a third page, none free: young is preempted
    assert batch.seqs == [old] and young.status is SequenceStatus.WAITING
    assert young.page_table == [] and young.num_preemptions == 1 and len(old.page_table) == 3


def test_request_too_long_for_the_pool_is_refused_clearly():
    sched = Scheduler(
        BlockManager(num_pages=4, page_size=4), max_batch_size=2, max_prefill_tokens=64
    )
    with pytest.raises(ValueError, match="only 4 pages"):
        sched.add(Sequence(0, 0, [1] * 10, max_tokens=8))  # 17 cached tokens = 5 pages
    sched.add(Sequence(1, 0, [1] * 10, max_tokens=7))  # 16 cached tokens fit exactly
    steps = run_to_completion(sched, [])
    assert len(steps) == 7


def test_group_larger_than_free_pages_is_split():
    bm = BlockManager(num_pages=6, page_size=4)
    sched = Scheduler(bm, max_batch_size=8, max_prefill_tokens=1024)
    seqs = make_seqs([6], n=5, max_tokens=2)  # 1 shared page + 1 private page each
    run_to_completion(sched, seqs)
    assert all(len(s.completion_ids) == 2 for s in seqs) and bm.num_free_pages == 6


def test_scheduling_code_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, sparrow.rollout.scheduler, sparrow.rollout.block_manager, "
        "sparrow.rollout.sequence; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=HANG_GUARD_S)
