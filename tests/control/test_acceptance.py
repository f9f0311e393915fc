"""Acceptance estimators against brute force; per-bin percentiles on constructed data."""

import pytest
import torch

from sparrow.control.acceptance import (
    bin_acceptance,
    exact_acceptance,
    flatten_completion,
    percentiles,
    topk_acceptance_bound,
)


def _brute_exact(p, q):
    return sum(min(a, b) for a, b in zip(p, q, strict=True))


def _brute_topk(p, q, k):
    """The paper's union-of-top-K rule with python dicts."""
    p_top = dict(sorted(enumerate(p), key=lambda x: -x[1])[:k])
    q_top = dict(sorted(enumerate(q), key=lambda x: -x[1])[:k])
    return sum(min(p_top.get(v, 0.0), q_top.get(v, 0.0)) for v in set(p_top) | set(q_top))


def _random_logprobs(n=6, v=13, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.log_softmax(2 * torch.randn(n, v, generator=g, dtype=torch.float64), -1)
    q = torch.log_softmax(p + torch.randn(n, v, generator=g, dtype=torch.float64), -1)
    return p, q


def test_hand_case():
    p = torch.tensor([[0.5, 0.3, 0.2]]).log()
    q = torch.tensor([[0.2, 0.3, 0.5]]).log()
    assert exact_acceptance(p, q).item() == pytest.approx(0.7)
    # top-2: p {0: .5, 1: .3}, q {2: .5, 1: .3}; only id 1 is on both sides.
    pv, pi = p.topk(2, -1)
    qv, qi = q.topk(2, -1)
    assert topk_acceptance_bound(pi, pv, qi, qv).item() == pytest.approx(0.3)


def test_exact_and_bound_match_brute_force():
    p, q = _random_logprobs()
    exact = exact_acceptance(p, q)
    for k in (1, 3, 5, 13):
        pv, pi = p.topk(k, -1)
        qv, qi = q.topk(k, -1)
        bound = topk_acceptance_bound(pi, pv, qi, qv, row_chunk=4)  # chunks cross rows
        for r in range(p.shape[0]):
            pp, qq = p[r].exp().tolist(), q[r].exp().tolist()
            assert exact[r].item() == pytest.approx(_brute_exact(pp, qq), rel=1e-6)
            assert bound[r].item() == pytest.approx(_brute_topk(pp, qq, k), rel=1e-6)
        assert (bound <= exact + 1e-6).all()
        if k == p.shape[1]:
            torch.testing.assert_close(bound, exact)  # K = V: the bound is exact


def test_exact_adds_up_over_vocabulary_chunks_and_is_one_for_equal():
    p, q = _random_logprobs(v=20)
    chunked = sum(exact_acceptance(p[:, s : s + 7], q[:, s : s + 7]) for s in range(0, 20, 7))
    torch.testing.assert_close(chunked, exact_acceptance(p, q))
    torch.testing.assert_close(exact_acceptance(p, p), torch.ones(p.shape[0], dtype=torch.float32))


def test_percentiles_linear_interpolation_hand_values():
    vals = torch.tensor([4.0, 1.0, 3.0, 2.0])  # sorted 1, 2, 3, 4; index q * 3
    assert percentiles(vals, (0.01, 0.05, 0.5)) == pytest.approx([1.03, 1.15, 2.5])
    x = torch.rand(101, generator=torch.Generator().manual_seed(0))
    qs = (0.01, 0.05, 0.5, 1.0)
    assert percentiles(x, qs) == pytest.approx(
        torch.quantile(x.double(), torch.tensor(qs, dtype=torch.float64)).tolist()
    )
    assert percentiles(torch.tensor([0.7]), qs) == pytest.approx([0.7] * 4)


def test_bins_by_absolute_position():
    # bin width 10: positions 0-9 -> bin 0 (values 0.0..0.9), 20-23 -> bin 2 (1, 2, 3, 4)
    acc = torch.cat([torch.arange(10) / 10, torch.tensor([4.0, 1.0, 3.0, 2.0])])
    pos = torch.cat([torch.arange(10), torch.tensor([20, 21, 22, 23])])
    stats = bin_acceptance(acc, pos, bin_tokens=10)
    assert [s.bin_index for s in stats] == [0, 2]  # empty bin 1 is absent
    b0, b2 = stats
    assert (b0.start_token, b0.end_token, b0.count) == (0, 10, 10)
    assert b0.mean == pytest.approx(0.45)
    assert (b0.p1, b0.p5, b0.p50) == pytest.approx((0.009, 0.045, 0.45))  # index q * 9, step 0.1
    assert (b2.start_token, b2.count, b2.mean) == (20, 4, pytest.approx(2.5))
    assert (b2.p1, b2.p5, b2.p50) == pytest.approx((1.03, 1.15, 2.5))


def test_flatten_completion_positions():
    vals = torch.tensor([[9.0, 1.0, 2.0, 9.0], [9.0, 9.0, 3.0, 9.0]])
    mask = torch.tensor([[False, True, True, False], [False, False, True, False]])
    v, pos = flatten_completion(vals, mask)
    assert v.tolist() == [1.0, 2.0, 3.0] and pos.tolist() == [1, 2, 2]
