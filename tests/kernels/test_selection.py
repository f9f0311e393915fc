"""Page selection (torch scoring) against the loop reference and the rule of docs/DESIGN.md §1."""

import pytest
import torch

from sparrow.kernels import select_pages, update_page_summaries
from sparrow.kernels.reference import select_pages_reference
from sparrow.kernels.selection import page_scores_torch

LENS = [200, 37, 16, 120, 1]  # 13, 3, 1, 8, 1 pages: partial, exact and single-token sequences
BUDGETS = [5, 3, 4, 3, 3]


def rows_of(selected):
    counts = selected.num_selected.tolist()
    pages = selected.logical_pages
    return [
        [pages[b, h, : counts[b]].tolist() for h in range(pages.shape[1])]
        for b in range(len(counts))
    ]


@pytest.mark.parametrize("score", ["centroid", "quest"])
@pytest.mark.parametrize("group", [1, 3, 4, 8])
def test_selection_equals_reference(paged_batch, score, group):
    batch = paged_batch(LENS, num_kv_heads=2, group=group, head_dim=64, seed=group)
    budgets = torch.tensor(BUDGETS, dtype=torch.int32)
    selected = select_pages(
        batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets, score=score
    )
    expected = select_pages_reference(
        batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets, score=score
    )
    assert rows_of(selected) == expected
    assert (
        selected.logical_pages.dtype == torch.int32 and selected.num_selected.dtype == torch.int32
    )


def test_selection_rule_sink_recent_and_counts(paged_batch):
    batch = paged_batch(LENS, num_kv_heads=3, group=2, head_dim=64)
    budgets = torch.tensor(BUDGETS, dtype=torch.int32)
    selected = select_pages(batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets)
    assert selected.num_selected.tolist() == [5, 3, 1, 3, 1]
    assert selected.logical_pages.shape == (5, 3, 5)  # padded to the batch's largest count
    rows = rows_of(selected)
    for h in range(3):
        assert rows[0][h][0] == 0 and rows[0][h][-2:] == [11, 12]  # sink + last two pages
        assert rows[0][h] == sorted(set(rows[0][h]))  # ascending, no duplicates
        assert rows[1][h] == [0, 1, 2]  # budget == pages: dense
        assert rows[3][h] == [0, 6, 7]  # budget 3: sink and recent only
    assert any(rows[0][h] != rows[0][0] for h in range(1, 3))  # heads choose independently


def test_selection_honours_num_sink_and_num_recent(paged_batch):
    batch = paged_batch([300], num_kv_heads=1, group=1, head_dim=64)  # 19 pages
    budgets = torch.tensor([6], dtype=torch.int32)
    selected = select_pages(
        batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets, num_sink=2, num_recent=3
    )
    pages = selected.logical_pages[0, 0].tolist()
    assert len(pages) == 6 and pages[:2] == [0, 1] and pages[-3:] == [16, 17, 18]


def test_quest_picks_the_page_holding_the_matching_key(paged_batch):
    batch = paged_batch([160], num_kv_heads=1, group=2, head_dim=64)  # 10 pages
    target = batch.q[0, 1] * 10.0  # a key aligned with the second query head only
    phys = int(batch.page_table[0, 4])
    batch.k_cache[phys, 7, 0] = target
    update_page_summaries(batch.k_cache, batch.summary, torch.tensor([phys]), torch.tensor([16]))
    budgets = torch.tensor([4], dtype=torch.int32)
    selected = select_pages(batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets)
    assert selected.logical_pages[0, 0].tolist() == [0, 4, 8, 9]


def test_quest_score_bounds_every_key_of_the_page(paged_batch):
    batch = paged_batch([90], num_kv_heads=2, group=3, head_dim=64)
    scores = page_scores_torch(
        batch.q, batch.summary, batch.page_table, batch.seq_lens, "quest", 16
    )
    for h in range(2):
        q_group = batch.q[0, 3 * h : 3 * h + 3]  # (G, D)
        for p in range(6):
            keys = batch.k_cache[int(batch.page_table[0, p]), : min(16, 90 - 16 * p), h]  # (T, D)
            assert float((q_group @ keys.T).max()) <= float(scores[0, h, p]) + 1e-4


def test_wide_padded_page_table_gives_the_same_selection(paged_batch):
    batch = paged_batch(LENS, num_kv_heads=2, group=2, head_dim=64)
    budgets = torch.tensor(BUDGETS, dtype=torch.int32)
    wide = torch.full((len(LENS), 500), -1, dtype=torch.int32)
    wide[:, : batch.page_table.shape[1]] = batch.page_table
    narrow = select_pages(batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets)
    padded = select_pages(batch.q, batch.summary, wide, batch.seq_lens, budgets)
    assert torch.equal(narrow.logical_pages, padded.logical_pages)
    assert torch.equal(narrow.num_selected, padded.num_selected)


@pytest.mark.parametrize("score", ["centroid", "quest"])
def test_samples_sharing_a_prompt_score_as_if_alone(paged_batch, score):
    """n samples of one prompt share its pages: the distinct-page path (each summary read once)
    must give every sequence the scores it gets when scored on its own (per-sequence path)."""
    batch = paged_batch([200] * 4, num_kv_heads=2, group=3, head_dim=64, seed=7)  # 13 pages each
    table = batch.page_table.clone()
    table[1:, :10] = table[0, :10]  # the first 10 pages are the shared prompt's
    batch.seq_lens[2] = 170  # one sample shorter: a column past its length is masked
    shared = page_scores_torch(batch.q, batch.summary, table, batch.seq_lens, score, 16)
    assert torch.unique(table).numel() * 2 <= table.numel()  # the distinct-page path ran
    for b in range(4):
        one = slice(b, b + 1)
        alone = page_scores_torch(
            batch.q[one], batch.summary, table[one], batch.seq_lens[one], score, 16
        )
        pages = -(-int(batch.seq_lens[b]) // 16)
        torch.testing.assert_close(shared[b, :, :pages], alone[0, :, :pages], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("score", ["centroid", "quest"])
def test_host_bounded_plan_selects_the_same_pages_without_a_sync(paged_batch, score):
    """Bounds known on the host (rounded up, as an engine's buckets are) give the same pages as
    the plan that reads them from the device, with fixed shapes and no host sync; the physical
    ids are the page table's entries for the chosen logical pages."""
    from sparrow.bench.dispatch_counter import DispatchCounter
    from sparrow.kernels.selection import selection_plan

    batch = paged_batch(LENS, num_kv_heads=2, group=3, head_dim=64, seed=5)
    budgets = torch.tensor(BUDGETS, dtype=torch.int32)
    rule = dict(page_size=16, num_sink=1, num_recent=2)
    ref = select_pages(
        batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets, score=score
    )
    with DispatchCounter(strict=True):  # raises on any host sync
        plan = selection_plan(
            batch.page_table, batch.seq_lens, budgets, **rule, max_selected=8, max_top=4
        )
        got = select_pages(
            batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets, score=score,
            validate=False, plan=plan, **rule,
        )  # fmt: skip
    assert got.logical_pages.shape == (5, 2, 8)  # padded to the bound, not the batch's 5
    assert rows_of(got) == rows_of(ref)
    live = (torch.arange(8) < got.num_selected[:, None, None]).expand(5, 2, 8)  # (B, H_kv, S)
    expected = batch.page_table.long().gather(1, got.logical_pages.flatten(1).long())
    assert torch.equal(got.physical_pages[live], expected.view(5, 2, 8)[live].int())
