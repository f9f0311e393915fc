"""The Triton page choice (top-k + compaction + physical ids in one kernel) under the interpreter
against the torch choice (selection.select_from_scores) and the loop reference."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from sparrow.kernels import score_triton, select_pages, select_triton  # noqa: E402
from sparrow.kernels.reference import select_pages_reference  # noqa: E402
from sparrow.kernels.selection import select_from_scores, selection_plan  # noqa: E402

if not (select_triton.INTERPRETED and score_triton.INTERPRETED):
    pytest.skip("Triton was imported before TRITON_INTERPRET was set", allow_module_level=True)

RULE = dict(page_size=16, num_sink=1, num_recent=2)
# pages 5, 7, 1, 3, 1, 20, 12: sparse, sparse, one page, budget > pages, one token, long rows
LENS = [70, 100, 16, 33, 1, 320, 190]
BUDGETS = [3, 5, 4, 8, 3, 9, 12]


def _table(lens, width, seed=0):
    """(B, width) int32 shuffled physical ids, -1 past each row's pages (as the engine pads)."""
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-n // 16) for n in lens]
    order = torch.randperm(sum(pages) + 7, generator=gen).int()
    table = torch.full((len(lens), width), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(pages):
        table[b, :n] = order[used : used + n]
        used += n
    return table


def _both(scores, table, lens, budgets, max_selected=None, max_top=None):
    """(torch choice, Triton choice) for the same scores."""
    plan = selection_plan(table, lens, budgets, **RULE, max_selected=max_selected, max_top=max_top)
    ref = select_from_scores(scores, lens, budgets, **RULE, plan=plan)
    got = select_triton.select_pages_triton(
        scores, table, lens, budgets, plan.num_selected, plan.max_selected, **RULE
    )
    return ref, got


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("slots", [None, 16])  # the batch's largest count, or a padded bucket
def test_choice_equals_torch_on_random_scores(heads, slots):
    """Logical pages, physical ids and padding slots as torch's top-k + sort + gathers give them,
    with scores of both signs and wide magnitudes (the radix select's key order)."""
    gen = torch.Generator().manual_seed(heads)
    lens = torch.tensor(LENS, dtype=torch.int32)
    budgets = torch.tensor(BUDGETS, dtype=torch.int32)
    table = _table(LENS, 23)
    scores = torch.randn(len(LENS), heads, 23, generator=gen) * torch.logspace(-3, 3, 23)
    ref, got = _both(scores, table, lens, budgets, slots, None if slots is None else 12)
    assert torch.equal(got.logical_pages, ref.logical_pages)
    assert torch.equal(got.physical_pages, ref.physical_pages)
    assert got.num_selected is ref.num_selected or torch.equal(got.num_selected, ref.num_selected)


def test_ties_go_to_the_lowest_pages():
    """Equal scores: the picks are the lowest candidate pages (a defined order, where top-k
    leaves it to the implementation)."""
    lens = torch.tensor([200], dtype=torch.int32)  # 13 pages: candidates 1..10
    budgets = torch.tensor([6], dtype=torch.int32)  # 3 picks
    scores = torch.zeros(1, 2, 13)
    scores[0, 1, 9] = 1.0  # head 1: one clear winner, then ties
    table = _table([200], 13)
    plan = selection_plan(table, lens, budgets, **RULE)
    got = select_triton.select_pages_triton(
        scores, table, lens, budgets, plan.num_selected, plan.max_selected, **RULE
    )
    assert got.logical_pages[0, 0].tolist() == [0, 1, 2, 3, 11, 12]
    assert got.logical_pages[0, 1].tolist() == [0, 1, 2, 9, 11, 12]


def test_long_row_in_one_program():
    """A 2K-page row (32K tokens at page 16) with a 128-page budget, as at the 1.7B preset."""
    gen = torch.Generator().manual_seed(3)
    lens = torch.tensor([2048 * 16 - 5, 700], dtype=torch.int32)
    budgets = torch.tensor([128, 128], dtype=torch.int32)
    table = _table(lens.tolist(), 2048, seed=3)
    scores = torch.randn(2, 2, 2048, generator=gen)
    ref, got = _both(scores, table, lens, budgets)
    assert torch.equal(got.logical_pages, ref.logical_pages)
    assert torch.equal(got.physical_pages, ref.physical_pages)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("score", ["quest", "centroid"])
def test_select_pages_triton_equals_reference(paged_batch, dtype, score):
    """The engine's Triton selection (score kernel, then the choice kernel) end to end: the loop
    reference's pages in fp32; in bf16 (queries and summaries in the cache dtype, as the engine
    keeps them) the torch choice over the same scores."""
    batch = paged_batch(LENS[:5], num_kv_heads=2, group=2, head_dim=64, seed=7)
    budgets = torch.tensor(BUDGETS[:5], dtype=torch.int32)
    summary = batch.summary
    if dtype != torch.float32:
        summary = type(summary)(*(t.to(dtype) for t in (summary.k_mean, summary.k_min,
                                                         summary.k_max)))  # fmt: skip
    q = batch.q.to(dtype)
    got = select_pages(q, summary, batch.page_table, batch.seq_lens, budgets, score=score,
                       backend="triton")  # fmt: skip
    shape = got.logical_pages.shape  # (B, H_kv, S)
    live = (torch.arange(shape[2]) < got.num_selected[:, None, None]).expand(shape)
    expected_phys = batch.page_table.long().gather(1, got.logical_pages.flatten(1).long())
    assert torch.equal(got.physical_pages[live], expected_phys.view(shape)[live].int())
    if dtype == torch.float32:
        expected = select_pages_reference(
            q, summary, batch.page_table, batch.seq_lens, budgets, score=score
        )
        rows = [
            [got.logical_pages[b, h, : int(got.num_selected[b])].tolist() for h in range(2)]
            for b in range(len(expected))
        ]
        assert rows == expected
    else:
        scores = score_triton.page_scores_triton(
            q, summary, batch.page_table[:, :7], batch.seq_lens, score, 16
        )
        ref = select_from_scores(scores, batch.seq_lens, budgets, **RULE)
        assert torch.equal(got.logical_pages, ref.logical_pages)


def test_launcher_rejects_bad_inputs():
    lens = torch.tensor([40], dtype=torch.int32)
    budgets = torch.tensor([3], dtype=torch.int32)
    table = _table([40], 3)
    with pytest.raises(ValueError, match="int32"):
        select_triton.select_pages_triton(
            torch.zeros(1, 1, 3), table.long(), lens, budgets, lens, 3, **RULE
        )
    with pytest.raises(ValueError, match="fp32"):
        select_triton.select_pages_triton(
            torch.zeros(1, 1, 3, dtype=torch.bfloat16), table, lens, budgets, lens, 3, **RULE
        )
