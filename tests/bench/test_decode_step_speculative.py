"""The speculative arm of `sparrow-bench decode-step` (decode_step_spec.py) at the tiny CPU
shape: the verify pass of k + 1 positions is timed beside both arms, the round's speedup over
dense follows from the three times at each predicted acceptance, the drafts are taken back
(the other arms' contexts are as without the arm), and --compile-only warms it."""

import json

import pytest

from sparrow.bench import cli
from sparrow.control.cost_model import expected_tokens_per_round
from sparrow.control.speculative_prediction import calibrated_acceptance

K = 2


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("decode_step_spec") / "decode_step.json"
    argv = ["decode-step", "--iters", "2", "--speculative-k", str(K), "--json", str(path)]
    assert cli.main(argv) == 0
    return json.loads(path.read_text())


def test_the_verify_pass_is_timed_and_gives_the_rounds_speedup(report):
    (run,) = report["runs"]
    spec = run["speculative"]
    assert report["speculative_k"] == spec["draft_tokens"] == K
    assert len(spec["steps_ms"]) == report["iters"] and spec["step_ms"] > 0
    sparse, dense = run["sparse"]["step_ms"], run["dense"]["step_ms"]
    assert spec["round_ms"] == pytest.approx(K * sparse + spec["step_ms"])
    assert spec["verify_over_dense_step"] == pytest.approx(spec["step_ms"] / dense)
    for a in calibrated_acceptance()[1] + [0.6, 0.95]:
        ratio = spec["speedup_vs_dense"][f"{a:.3f}"]
        assert ratio == pytest.approx(expected_tokens_per_round(a, K) * dense / spec["round_ms"])
    assert report["problems"] == []


def test_the_drafts_are_taken_back(report):
    """The verify arm runs first; the sparse arm then appends its warm-up and timed tokens to
    the context the sequences were built with, nothing more."""
    (run,) = report["runs"]
    grown = max(1, report["warmup"]) + report["iters"]
    assert run["sparse"]["context_tokens_at_end"] == report["context_tokens"] + grown


def test_compile_only_warms_the_verify_pass(tmp_path):
    path = tmp_path / "compile.json"
    argv = ["decode-step", "--compile-only", "--speculative-k", str(K), "--json", str(path)]
    assert cli.main(argv) == 0
    assert json.loads(path.read_text())["errors"] == []
