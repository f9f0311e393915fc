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


def _verl_k3_loss_term(d: float) -> float:
    """verl 0.9.1 core_algos.kl_penalty_forward "low_var_kl" of one token with log-ratio d."""
    d = min(max(d, -20.0), 20.0)
    return min(max(math.exp(d) - d - 1, -10.0), 10.0)


def test_k3_is_bounded_per_token_like_the_kl_loss():
    """One row with log-ratios 30 (clamped to 20: unbounded k3 e^20 - 21 = 4.85e8), 3 (k3 16.1),
    -12 (k3 11.0) and 0.5: each token adds at most 10, the bound verl puts on its KL loss's k3
    (unbounded, the metric read 1.2e8 here; verl's rollout_corr/k3_kl, which does not clamp d
    either, would read 2.7e12)."""
    ds = [30.0, 3.0, -12.0, 0.5]
    mask = torch.ones(1, 4, dtype=torch.bool)
    rollout = torch.full((1, 4), -1.5, dtype=torch.float64)
    dense = rollout + torch.tensor([ds], dtype=torch.float64)
    m = mismatch_metrics(rollout, dense, mask, bin_tokens=2, ranks=Ranks.of_process_group())
    want = [_verl_k3_loss_term(d) for d in ds]
    assert want[:3] == [10.0, 10.0, 10.0]
    assert m["mismatch/k3"] == pytest.approx(sum(want) / 4, rel=1e-12)
    assert m["mismatch/k3/bin0"] == 10.0
    assert m["mismatch/k3/bin1"] == pytest.approx((10.0 + k3(0.5)) / 2, rel=1e-12)
    assert m["mismatch/k1"] == pytest.approx(-(20.0 + 3.0 - 12.0 + 0.5) / 4, rel=1e-12)
