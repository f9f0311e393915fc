"""DAPO's soft overlong penalty by hand (verl 0.9.1's overlong_buffer formula) and the rows that
overlong filtering leaves out."""

import pytest
import torch

from sparrow.rl.overlong import OverlongConfig, overlong_penalty, truncated_rows


def test_penalty_is_zero_then_linear_to_the_factor_at_the_limit():
    # L = 100, buffer 20: free up to 80 tokens, then -(n - 80) / 20 x factor.
    lengths = torch.tensor([10, 80, 81, 90, 100])
    got = overlong_penalty(lengths, 100, OverlongConfig(buffer=20, penalty_factor=0.5))
    want = [0.0, 0.0, -0.5 / 20, -0.5 * 10 / 20, -0.5]
    assert got.tolist() == pytest.approx(want)


def test_off_by_default():
    assert overlong_penalty(torch.tensor([100]), 100, OverlongConfig()).tolist() == [0.0]


def test_truncated_rows_are_the_length_stops():
    got = truncated_rows(["eos", "length", "stop", "length"])
    assert got.tolist() == [False, True, False, True]


def test_bad_values_name_the_key():
    with pytest.raises(ValueError, match="rl.overlong"):
        OverlongConfig(buffer=-1)
