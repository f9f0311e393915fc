"""KV writes land at page * PAGE_SIZE + offset; page summaries equal a direct computation."""

import pytest
import torch

from sparrow.kernels import PageSummary, update_page_summaries, write_kv


def test_write_kv_places_each_token_at_its_slot():
    k_cache = torch.zeros(4, 16, 2, 8)
    v_cache = torch.zeros_like(k_cache)
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    slots = torch.tensor([2 * 16 + 5, 0, 3 * 16 + 15])
    write_kv(k_cache, v_cache, k, v, slots)
    assert torch.equal(k_cache[2, 5], k[0]) and torch.equal(v_cache[2, 5], v[0])
    assert torch.equal(k_cache[0, 0], k[1]) and torch.equal(k_cache[3, 15], k[2])
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 3  # nothing else was touched


def test_write_kv_casts_to_cache_dtype():
    k_cache = torch.zeros(2, 16, 1, 8, dtype=torch.bfloat16)
    k = torch.randn(1, 1, 8)
    write_kv(k_cache, torch.zeros_like(k_cache), k, k, torch.tensor([17]))
    assert torch.equal(k_cache[1, 1], k[0].bfloat16())


def test_page_summaries_ignore_slots_past_fill_count():
    k_cache = torch.full((3, 16, 2, 8), float("nan"))
    k_cache[1, :5] = torch.randn(5, 2, 8)
    k_cache[2] = torch.randn(16, 2, 8)
    summary = PageSummary.empty(3, 2, 8, "cpu")
    update_page_summaries(k_cache, summary, torch.tensor([1, 2]), torch.tensor([5, 16]))
    for page, fill in ((1, 5), (2, 16)):
        keys = k_cache[page, :fill]  # (fill, H_kv, D)
        torch.testing.assert_close(summary.k_mean[page], keys.mean(0))
        assert torch.equal(summary.k_min[page], keys.amin(0))
        assert torch.equal(summary.k_max[page], keys.amax(0))
    assert torch.equal(summary.k_mean[0], torch.zeros(2, 8))  # untouched page stays as it was


def test_write_kv_rejects_mismatched_shapes():
    k_cache = torch.zeros(2, 16, 2, 8)
    with pytest.raises(ValueError, match=r"\(N, H_kv, D\)"):
        write_kv(
            k_cache, k_cache.clone(), torch.randn(3, 1, 8), torch.randn(3, 1, 8), torch.arange(3)
        )


@pytest.mark.parametrize("score", ["quest", "centroid"])
def test_summaries_hold_only_what_the_score_reads_in_the_cache_dtype(score):
    k_cache = (3 * torch.randn(4, 16, 2, 64)).bfloat16()
    pages, fills = torch.tensor([0, 2, 3]), torch.tensor([16, 7, 1])
    full = PageSummary.empty(4, 2, 64, "cpu")  # fp32, every table
    update_page_summaries(k_cache, full, pages, fills)
    small = PageSummary.empty(4, 2, 64, "cpu", score=score, dtype=torch.bfloat16)
    update_page_summaries(k_cache, small, pages, fills)
    assert [t.dtype for t in small.tables] == [torch.bfloat16] * len(small.tables)
    if score == "quest":
        assert small.k_mean is None
        # min/max of bf16 keys are bf16 values: the half-size tables lose nothing.
        assert torch.equal(small.k_min.float(), full.k_min)
        assert torch.equal(small.k_max.float(), full.k_max)
    else:
        assert small.k_min is None and small.k_max is None
        assert torch.equal(small.k_mean, full.k_mean.bfloat16())  # one rounding of the fp32 mean
    assert small.num_kv_heads == 2


def test_selection_refuses_summaries_its_mode_or_backend_cannot_read():
    from sparrow.kernels import select_pages

    summary = PageSummary.empty(4, 1, 16, "cpu", score="quest")  # min/max only
    q, table = torch.randn(1, 2, 16), torch.tensor([[0, 1, 2, 3]], dtype=torch.int32)
    lens, budgets = torch.tensor([64], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    with pytest.raises(ValueError, match="centroid scoring needs"):
        select_pages(q, summary, table, lens, budgets, score="centroid", backend="torch")
    half = PageSummary.empty(4, 1, 16, "cpu", score="quest", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="fp32 page summaries"):
        select_pages(q.bfloat16(), half, table, lens, budgets, score="quest", backend="torch")
    assert select_pages(q, summary, table, lens, budgets, backend="torch").num_selected == 3
