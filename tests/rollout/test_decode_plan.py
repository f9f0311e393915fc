"""The decode plan: persistent page table updated by what changed, buckets, padding rows."""

import random

import torch

from sparrow.rollout.block_manager import BlockManager
from sparrow.rollout.decode_plan import ROW_FIELDS, DecodePlan, bucket
from sparrow.rollout.scheduler import DecodeBatch, Scheduler
from sparrow.rollout.sequence import Sequence

PAGE = 4


def new_plan(pad_shapes=False, slots=2, columns=2, scratch=1000):
    return DecodePlan(
        page_size=PAGE,
        num_sink=1,
        num_recent=2,
        scratch_page=scratch,
        device=torch.device("cpu"),
        pad_shapes=pad_shapes,
        slots=slots,
        columns=columns,
    )


def check_step(step, seqs, budgets):
    """Every real row of the step says what the sequences' host state says."""
    rows = dict(zip(ROW_FIELDS, step.rows.tolist(), strict=True))
    for i, seq in enumerate(seqs):
        n = len(seq.page_table)
        assert step.page_table[i, :n].tolist() == seq.page_table
        assert rows["lens"][i] == seq.num_tokens
        assert rows["input_ids"][i] == seq.last_token_id
        pos = seq.num_tokens - 1
        assert rows["positions"][i] == pos
        assert rows["last_page"][i] == seq.page_table[pos // PAGE]
        assert rows["slot_mapping"][i] == seq.page_table[pos // PAGE] * PAGE + pos % PAGE
        assert rows["last_fill"][i] == pos % PAGE + 1
        if budgets is not None:
            assert rows["budgets"][i] == budgets[i]


def test_bucket_rounds_up_to_few_repeating_sizes():
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9, 11, 16, 17, 33, 100, 2049)] == [
        1, 2, 4, 8, 8, 10, 12, 16, 20, 40, 112, 2560,
    ]  # fmt: skip
    for n in range(1, 3000):
        assert n <= bucket(n) <= max(1.25 * n, 8)
    assert len({bucket(n) for n in range(1, 2049)}) <= 40


def test_scheduler_driven_steps_write_only_what_changed():
    """Steps driven by the real scheduler (prefills, finishes, preemptions in a small pool): each
    step's table equals the sequences' page tables, and a step writes only new pages (or the
    whole row of a sequence new to the plan)."""
    rng = random.Random(0)
    bm = BlockManager(num_pages=16, page_size=PAGE)
    sched = Scheduler(bm, max_batch_size=6, max_prefill_tokens=64)
    for i in range(10):
        if i % 2 == 0:  # two samples per prompt: they share its full pages
            prompt = [rng.randrange(5, 50) for _ in range(rng.randrange(3, 15))]
        sched.add(Sequence(i, i // 2, list(prompt), max_tokens=rng.randrange(5, 30)))
    plan = new_plan()
    known: dict[int, tuple[int, int]] = {}  # id(seq) -> (pages, preemptions) at the last step
    decode_steps = 0
    while not sched.is_finished():
        batch = sched.schedule()
        if isinstance(batch, DecodeBatch):
            budgets = [rng.randrange(3, 8) for _ in batch.seqs]
            step = plan.update(batch.seqs, budgets)
            check_step(step, batch.seqs, budgets)
            expected = 0
            for seq in batch.seqs:
                pages, epoch = known.get(id(seq), (0, -1))
                expected += len(seq.page_table) - (pages if epoch == seq.num_preemptions else 0)
            assert plan.last_update_entries == expected
            known = {id(s): (len(s.page_table), s.num_preemptions) for s in batch.seqs}
            decode_steps += 1
            seqs = batch.seqs
        else:
            seqs = [s for g in batch.groups for s in g]
        for seq in seqs:
            seq.completion_ids.append(rng.randrange(5, 50))
            if len(seq.completion_ids) >= seq.max_tokens:
                sched.finish(seq, "length")
    assert decode_steps > 20 and sched.num_preemptions > 0
    assert plan.table.shape[0] > 3  # grew past the initial 2 slots (+ the padding row)


def test_steady_step_writes_only_the_new_pages():
    seqs = [Sequence(i, i, [7] * (4 * PAGE + 1 + i), 99) for i in range(3)]
    for i, seq in enumerate(seqs):
        seq.page_table = list(range(10 * i, 10 * i + 5 + (i > 2)))
    plan = new_plan(slots=8, columns=8)
    plan.update(seqs, None)
    assert plan.last_update_entries == 15
    plan.update(seqs, None)
    assert plan.last_update_entries == 0
    seqs[1].completion_ids += [1, 1, 1]
    seqs[1].page_table.append(99)  # crossed into a sixth page
    step = plan.update(seqs, None)
    assert plan.last_update_entries == 1
    check_step(step, seqs, None)


def test_padded_step_rounds_shapes_and_points_padding_at_the_scratch_page():
    seqs = [Sequence(i, i, [7] * (10 * PAGE + 1 + i), 99) for i in range(3)]  # 11 pages each
    for i, seq in enumerate(seqs):
        seq.page_table = list(range(20 * i, 20 * i + -(-seq.num_tokens // PAGE)))
    plan = new_plan(pad_shapes=True, slots=4, columns=4, scratch=500)
    step = plan.update(seqs, [6, 6, 6])
    assert step.page_table.shape == (4, 12)  # batch 3 -> 4, pages 11 -> 12
    assert (step.max_selected, step.max_top) == (8, 4)  # 6 -> 8 slots, 3 -> 4 picks
    check_step(step, seqs, [6, 6, 6])
    rows = dict(zip(ROW_FIELDS, step.rows[:, 3].tolist(), strict=True))
    assert step.page_table[3].tolist() == [500] * 12
    assert rows["lens"] == 1 and rows["slot_mapping"] == 500 * PAGE and rows["last_page"] == 500
    assert rows["budgets"] >= 3  # a valid budget: the padding row is a one-page dense row
    assert step.shape_key == plan.update(seqs, [6, 6, 6]).shape_key
