"""`sparrow-bench decode-step` at its tiny CPU shape: the JSON holds both arms' step times, their
ratio, the shapes, the device and the graphs setting; the bench fails when it skipped work."""

import json

import pytest

from sparrow.bench import cli
from sparrow.bench.decode_step import problems
from sparrow.bench.step_timer import host_share


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("decode_step") / "decode_step.json"
    assert cli.main(["decode-step", "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_json_holds_both_arms_and_their_ratio(report):
    assert report["device"] == "cpu" and report["timer"] == "wall clock"
    assert report["graphs"] == [False]  # CUDA graphs need CUDA
    (run,) = report["runs"]
    assert (run["batch"], run["prompts"], run["samples"], run["graphs"]) == (4, 2, 2, False)
    for arm in ("sparse", "dense"):
        times = run[arm]["steps_ms"]
        assert len(times) == report["iters"] and min(times) > 0
        assert run[arm]["step_ms"] == pytest.approx(sorted(times)[len(times) // 2], rel=1e-3)
        assert run[arm]["host_share"] is None  # no device timeline on a CPU
        # every timed step appended a token: the context grew past the configured one
        assert run[arm]["context_tokens_at_end"] > report["context_tokens"]
    assert run["ratio"] == pytest.approx(run["dense"]["step_ms"] / run["sparse"]["step_ms"])
    assert report["ratio"] == {"batch 4, graphs off": run["ratio"]}
    assert report["problems"] == []


def test_json_states_the_shapes_and_kv_bytes(report):
    model = report["model"]
    assert (model["name"], model["layers"], model["kv_heads"], model["head_dim"]) == (
        "qwen3-debug", 3, 2, 16,
    )  # fmt: skip
    assert (report["context_tokens"], report["budget_tokens"], report["budget_pages"]) == (
        256, 64, 4,
    )  # fmt: skip
    # fp32: 3 layers x K and V x 2 heads x 16 dims x 4 bytes per token
    assert report["kv_bytes_per_token"] == 3 * 2 * 2 * 16 * 4
    kv = report["runs"][0]["kv_bytes"]
    # 255-token prompts: 2 x 15 full pages shared by the samples, and each sample's private last
    # page (its 16th token is the fed one), 16 tokens a page
    assert kv["held"] == (2 * 15 + 4) * 16 * report["kv_bytes_per_token"]
    assert kv["read_per_step_dense"] == 4 * 256 * report["kv_bytes_per_token"]
    assert 0 < kv["read_per_step_sparse"] < kv["read_per_step_dense"]
    assert kv["pool"] >= kv["held"]


def test_a_skipped_configuration_is_a_failure(report):
    bad = json.loads(json.dumps(report))
    bad["runs"][0]["sparse"]["steps_ms"] = []
    assert problems(bad) == ["batch 4, graphs off: the sparse step was not timed"]
    bad = json.loads(json.dumps(report))
    bad["runs"][0]["graphs"] = True  # graphs asked for, none replayed
    assert len(problems(bad)) == 2
    bad["runs"] = []
    assert problems(bad) == ["0 of 1 configurations ran"]


def test_host_share_is_the_gpus_idle_part_of_the_step():
    assert host_share(10.0, 7.5) == pytest.approx(0.25)
    assert host_share(10.0, 12.0) == 0.0  # profiler overlap: clipped
    assert host_share(10.0, None) is None
