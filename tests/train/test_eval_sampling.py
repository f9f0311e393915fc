"""pass@k and mean@k of the held-out evaluation (issue 50): the estimator against values worked
out by hand, the metrics of k samples on a scripted engine (pass@j counts full marks only,
mean@k partial credit too), and the default evaluation's metric names unchanged."""

import math
from fractions import Fraction
from types import SimpleNamespace

import pytest

from sparrow.rollout.engine import SamplingParams
from sparrow.tasks.data import Prompt
from sparrow.tasks.rewards import GuardedReward, RewardConfig, build_reward
from sparrow.train.evaluation import (
    eval_sampling,
    evaluate,
    mean_interval,
    pass_at_k,
    pass_ks,
    sampled_metrics,
    wilson_interval,
)

# (n, c, k) -> 1 - C(n-c, k) / C(n, k), worked out by hand.
BY_HAND = {
    (5, 2, 2): 1 - Fraction(3, 10),  # C(3,2)=3, C(5,2)=10
    (10, 3, 4): 1 - Fraction(35, 210),  # C(7,4)=35, C(10,4)=210
    (4, 1, 2): 1 - Fraction(3, 6),  # C(3,2)=3, C(4,2)=6
    (4, 0, 2): Fraction(0),
    (4, 3, 2): Fraction(1),  # n - c = 1 < k: every pair holds a correct sample
    (8, 8, 8): Fraction(1),
    (8, 1, 1): Fraction(1, 8),  # pass@1 = c / n
}


@pytest.mark.parametrize(("n", "c", "k"), sorted(BY_HAND))
def test_pass_at_k_equals_the_estimator_by_hand(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(float(BY_HAND[(n, c, k)]), abs=1e-12)


def test_pass_at_k_stays_exact_where_the_binomials_overflow_a_float():
    n, c, k = 2000, 7, 500  # C(2000, 500) ~ 1e486: as a float it overflows
    with pytest.raises(OverflowError):
        float(math.comb(n, k))
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9)
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(4, 5, 2)


def test_pass_ks_are_powers_of_two_below_k_and_k():
    assert pass_ks(1) == []
    assert pass_ks(2) == [2]
    assert pass_ks(6) == [2, 4, 6]
    assert pass_ks(8) == [2, 4, 8]


def test_mean_interval_is_the_normal_approximation_and_wilson_at_zero_spread():
    values = [0.0, 0.5, 1.0, 1.0]  # mean 0.625, sample variance 0.2291666...
    lo, hi = mean_interval(sum(values), sum(v * v for v in values), len(values))
    half = 1.96 * math.sqrt((sum((v - 0.625) ** 2 for v in values) / 3) / 4)
    assert (lo, hi) == pytest.approx((0.625 - half, min(0.625 + half, 1.0)))
    assert mean_interval(4.0, 4.0, 4) == wilson_interval(4.0, 4)  # all 1: not a 0-wide interval
    assert mean_interval(0.0, 0.0, 4)[1] > 0


class ScriptedEngine:
    """Answers prompt i's sample j with completions[i][j] (greedy: the first one)."""

    def __init__(self, completions: list[list[str]]):
        self.completions = completions
        self.calls = []

    def generate(self, prompt_ids, params, n=1, seed=None):
        self.calls.append((params.temperature, n))
        return [
            SimpleNamespace(text=self.completions[i][j], token_ids=[0] * (j + 1), prompt_index=i)
            for i in range(len(prompt_ids))
            for j in range(n)
        ]


def _prompts(answers: list[str]) -> list[Prompt]:
    return [Prompt(i, f"q{i}", [1, 2], a, {}) for i, a in enumerate(answers)]


def test_k_samples_give_pass_at_j_and_mean_at_k_of_the_fixture():
    # Correct samples per prompt out of 4: 0, 1, 2, 4.
    completions = [["x"] * 4, ["7", "x", "x", "x"], ["x", "8", "8", "x"], ["9"] * 4]
    prompts = _prompts(["6", "7", "8", "9"])
    reward = build_reward(RewardConfig(name="exact_match"))
    params = SamplingParams(temperature=1.0, max_tokens=8)
    metrics = sampled_metrics(ScriptedEngine(completions), reward, prompts, params, 4)
    by_hand = {
        "pass@2": [0, 1 - Fraction(3, 6), 1 - Fraction(1, 6), 1],
        "pass@4": [0, 1, 1, 1],
        "mean@4": [0, Fraction(1, 4), Fraction(2, 4), 1],
    }
    for name, values in by_hand.items():
        floats = [float(v) for v in values]
        assert metrics[f"eval/{name}"] == pytest.approx(sum(floats) / 4)
        lo, hi = mean_interval(sum(floats), sum(v * v for v in floats), 4)
        assert metrics[f"eval/{name}_lo95"] == pytest.approx(lo)
        assert metrics[f"eval/{name}_hi95"] == pytest.approx(hi)
        assert lo < metrics[f"eval/{name}"] < hi
    assert not any(key.startswith("eval/pass@1") for key in metrics)


def test_pass_at_j_counts_full_marks_only_and_mean_at_k_counts_partial_credit():
    # "half" earns 0.5, "almost" 0.99: partial credit. With each replaced by a wrong answer
    # (0) pass@j must not move, while mean@k loses exactly the partial credit.
    marks = {"right": 1.0, "half": 0.5, "almost": 0.99, "wrong": 0.0}
    reward = GuardedReward(lambda p, c, r: marks[c], "marks", timeout_s=None)
    partial = [
        ["half", "half", "half", "half"],  # partial credit only: no correct sample
        ["right", "half", "almost", "wrong"],
        ["half", "right", "right", "wrong"],
    ]
    without = [["wrong" if c in ("half", "almost") else c for c in s] for s in partial]
    params = SamplingParams(temperature=1.0, max_tokens=8)
    prompts = _prompts(["a", "b", "c"])
    got, base = (
        sampled_metrics(ScriptedEngine(c), reward, prompts, params, 4) for c in (partial, without)
    )
    for name in ("pass@2", "pass@4"):
        for suffix in ("", "_lo95", "_hi95"):
            assert got[f"eval/{name}{suffix}"] == base[f"eval/{name}{suffix}"], name + suffix
    # c correct of 4 per prompt: 0, 1, 2 -> pass@2 = 0, 1/2, 5/6.
    assert got["eval/pass@2"] == pytest.approx((0 + 1 / 2 + 5 / 6) / 3)
    credit = (4 * 0.5) + (0.5 + 0.99) + 0.5  # the partial marks, per prompt of 4 samples
    assert got["eval/mean@4"] - base["eval/mean@4"] == pytest.approx(credit / 4 / 3)


LEGACY_KEYS = {
    "eval/accuracy",
    "eval/accuracy_lo95",
    "eval/accuracy_hi95",
    "eval/accuracy_ci95",
    "eval/n",
    "eval/len_mean",
    "eval/samples",
}


def test_default_evaluation_keeps_its_metrics_and_k_samples_add_theirs_beside_greedy():
    completions = [["6", "x", "6"], ["x", "x", "7"]]
    prompts = _prompts(["6", "7"])
    reward = build_reward(RewardConfig(name="exact_match"))
    params, sample_params = eval_sampling(0.0, 8, 1)
    assert sample_params is None and params == SamplingParams(temperature=0.0, max_tokens=8)
    engine = ScriptedEngine(completions)
    default, per_prompt = evaluate(engine, reward, prompts, params)
    assert set(default) == LEGACY_KEYS and engine.calls == [(0.0, 1)]
    assert default["eval/accuracy"] == 0.5 and per_prompt == [1.0, 0.0]

    params, sample_params = eval_sampling(0.7, 8, 3)
    engine = ScriptedEngine(completions)
    both, _ = evaluate(engine, reward, prompts, params, samples=3, sample_params=sample_params)
    assert engine.calls == [(0.0, 1), (0.7, 3)]  # greedy accuracy, then 3 samples at T=0.7
    assert {k: both[k] for k in LEGACY_KEYS} == default
    assert both["eval/mean@3"] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert both["eval/pass@3"] == 1.0
    assert both["eval/pass@2"] == pytest.approx((1.0 + (1 - 1 / 3)) / 2)
