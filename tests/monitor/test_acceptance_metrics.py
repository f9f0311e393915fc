"""The step's acceptance metrics on constructed data: the exact acceptance of the measured rows
binned by position, the noise-floor rows logged apart and kept out of the controller's stats, the
top-K bound over every sparse row."""

import math
from types import SimpleNamespace

import pytest
import torch

from sparrow.distributed import Ranks
from sparrow.monitor.acceptance_metrics import AcceptanceMetrics, ExactAcceptance


def _batch_and_dense():
    """3 rows, completion at positions 2-5; both sides' top-1 is token 0 at p = 0.3."""
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[:, 2:] = True
    ids = torch.zeros(3, 6, 1, dtype=torch.int64)
    logprobs = torch.full((3, 6, 1), math.log(0.3))
    batch = SimpleNamespace(completion_mask=mask, topk_ids=ids, topk_logprobs=logprobs)
    return batch, SimpleNamespace(topk_ids=ids, topk_logprobs=logprobs)


def test_metrics_keep_the_noise_floor_apart_from_the_controllers_stats():
    batch, dense = _batch_and_dense()
    floor_rows = torch.tensor([False, True, False])  # row 1 rolled out densely
    values = torch.tensor(
        [[0, 0, 0.5, 0.7, 0.9, 0.9], [0, 0, 0.99, 0.99, 0.97, 0.97]]
    )  # exact acceptance of rows 0 and 1 (row 2 not measured exactly)
    exact = ExactAcceptance(values, torch.tensor([True, True, False]))
    result = AcceptanceMetrics(bin_tokens=4, ranks=Ranks(0, 1)).measure(
        batch, dense, floor_rows, exact
    )
    # The controller reads row 0's tokens alone: bin 0 holds positions 2-3, bin 1 positions 4-5.
    assert [(s.bin_index, s.count) for s in result.stats] == [(0, 2), (1, 2)]
    assert result.stats[0].mean == pytest.approx(0.6) and result.stats[0].p50 == pytest.approx(0.6)
    assert result.stats[1].p5 == pytest.approx(0.9)
    m = result.metrics
    assert m["accept/p5_min"] == pytest.approx(0.5 + 0.05 * 0.2)  # index q * (n - 1) = 0.05
    assert (m["noise_floor/mean/bin0"], m["noise_floor/mean/bin1"]) == pytest.approx((0.99, 0.97))
    assert m["noise_floor/count/bin0"] == 2 and m["noise_floor/count/bin1"] == 2
    # The top-K bound covers every sparse row (0 and 2, not the floor): 8 tokens at 0.3 each.
    assert m["accept_topk/mean"] == pytest.approx(0.3)
    assert m["accept_topk/count/bin0"] + m["accept_topk/count/bin1"] == 8
    assert result.histograms["accept/histogram"] == pytest.approx([0.5, 0.7, 0.9, 0.9])
