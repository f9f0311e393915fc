"""The rollout-vs-dense mismatch metrics (sparrow/monitor/mismatch.py) by hand on a padded batch."""

import math

import pytest
import torch

from sparrow.distributed import Ranks
from sparrow.monitor.mismatch import mismatch_metrics

# Two rows; absolute positions 0-4, bins of 2 tokens. Row 0 has completion tokens at 2, 3, 4;
# row 1 at 2, 3 (4 is padding). d = log p_dense - log q_rollout per token.
D = {(0, 2): 0.5, (0, 3): -1.0, (0, 4): 0.0, (1, 2): -0.2, (1, 3): 2.0}


def batch():
    mask = torch.zeros(2, 5, dtype=torch.bool)
    rollout = torch.full((2, 5), -1.5)
    dense = torch.zeros(2, 5)
    for (b, t), d in D.items():
        mask[b, t] = True
        dense[b, t] = rollout[b, t] + d
    dense[1, 4] = 40.0  # padding: must not reach any figure
    return rollout, dense, mask


def k3(d: float) -> float:
    return math.exp(d) - 1 - d


def test_figures_by_hand():
    rollout, dense, mask = batch()
    m = mismatch_metrics(rollout, dense, mask, bin_tokens=2, ranks=Ranks.of_process_group())
    ds = list(D.values())
    assert m["mismatch/k1"] == pytest.approx(-sum(ds) / 5, rel=1e-6)
    assert m["mismatch/k3"] == pytest.approx(sum(map(k3, ds)) / 5, rel=1e-6)
    ppl = (math.exp(-(0.5 - 1.0 + 0.0) / 3) + math.exp(-(-0.2 + 2.0) / 2)) / 2
    assert m["mismatch/ppl_ratio"] == pytest.approx(ppl, rel=1e-6)
    assert m["mismatch/ratio_max"] == pytest.approx(math.exp(2.0), rel=1e-6)
    assert m["mismatch/ratio_min"] == pytest.approx(math.exp(-1.0), rel=1e-6)
    # bin 1: positions 2, 3 of both rows; bin 2: position 4 of row 0 only.
    assert m["mismatch/k1/bin1"] == pytest.approx(-(0.5 - 1.0 - 0.2 + 2.0) / 4, rel=1e-6)
    assert m["mismatch/k3/bin1"] == pytest.approx(sum(map(k3, [0.5, -1.0, -0.2, 2.0])) / 4)
    assert m["mismatch/k3/bin2"] == 0.0 and "mismatch/k1/bin0" not in m


def test_rows_left_out_and_nothing_left():
    rollout, dense, mask = batch()
    ranks = Ranks.of_process_group()
    only_row0 = mask & torch.tensor([True, False])[:, None]
    m = mismatch_metrics(rollout, dense, only_row0, 2, ranks)
    assert m["mismatch/ratio_max"] == pytest.approx(math.exp(0.5), rel=1e-6)
    assert mismatch_metrics(rollout, dense, torch.zeros_like(mask), 2, ranks) == {}
