"""Without math-verify the math reward refuses to start instead of scoring every completion 0."""

import sys

import pytest

from sparrow.tasks.rewards import RewardConfig, build_reward


def test_math_reward_without_math_verify_fails_loudly(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import math_verify now fails
    with pytest.raises(ImportError, match="needs math-verify"):
        build_reward(RewardConfig(name="math"))
    # The short-answer reward needs nothing extra.
    assert build_reward(RewardConfig(name="exact_match"))("", "42", "42").score == 1.0
