"""`sparrow-bench step` on tiny shapes: both runs finish, the JSON holds the documented keys, and
the speedups are the ratios of the measured phases (speed itself is not asserted)."""

import json

import pytest
import torch

from sparrow.bench import cli
from sparrow.bench.step import _set, problems
from sparrow.models.loading import ModelConfig, load_model
from sparrow.models.random_init import build_random_model, random_model_config, save_random_model


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("bench_step")
    path = tmp_path / "step.json"
    argv = [
        "step",
        "--warmup",
        "--random-model",  # the GPU script's path: a saved random model, EOS ignored
        "qwen3-debug",
        "--json",
        str(path),
        "preset=tiny",
        "schedule=smollm2_long_b32",
        "schedule.budgets_pages=[3]",  # sink + recent pages only: sparse past 48 tokens
        "schedule.mode=fixed",  # must not leak into the dense run (it once made it sparse)
        "rollout.max_new_tokens=40",
        "distill=default",  # the GPU check's distill stage: the adapter's update in the sparse run
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPARROW_CACHE", str(tmp_path / "cache"))
        assert cli.main(argv) == 0
    return json.loads(path.read_text())


def test_step_bench_runs_sparse_and_dense(report):
    assert {"sparse", "dense", "rollout_speedup", "step_speedup"} <= report.keys()
    sparse, dense = report["sparse"], report["dense"]
    assert sparse["schedule"] == "fixed" and sparse["budgets_pages"] == [3]
    assert dense["schedule"] == "dense" and dense["budgets_pages"] == []
    # The dense baseline skips the exact replay (nothing sparse to monitor) unless asked to.
    assert sparse["exact_monitor"] and not dense["exact_monitor"]
    # No dense noise-floor share in the sparse rollout (preset=tiny would roll out 1 of 4 densely).
    assert "monitor.noise_floor_fraction=0" in report["config"]["overrides"]
    for run in (sparse, dense):
        assert run["completion_tokens"] == 4 * 4 * 40  # 4 prompts x 4 samples, fixed length
        assert {"rollout", "monitor", "update", "sync"} <= set(run["phases"])
        assert "logprobs" not in run["phases"]  # rl.dense_pass=update: one dense forward
        assert run["phases"][-1] == "step" and all(run[f"{p}_s"] >= 0 for p in run["phases"])
        parts = sum(run[f"{p}_s"] for p in run["phases"][:-1])
        assert parts == pytest.approx(run["step_s"], abs=1e-4)  # the phases tile the step
        assert run["rollout_tok_s"] == pytest.approx(run["completion_tokens"] / run["rollout_s"])
    assert sparse["prompt_len_mean"] == dense["prompt_len_mean"]  # same seed, same prompts
    assert dense["kv_read_ratio"] == 1.0 and sparse["kv_read_ratio"] < 1.0
    assert sparse["predicted_speedup"] is not None and dense["predicted_speedup"] is None
    assert 0.0 < sparse["accept_p5_min"] <= 1.0


def test_both_runs_time_an_actor_update(report):
    # A random-weight model scores every completion 0: zero advantages, which the trainer's
    # rl.skip_no_signal would skip; the bench turns the skip off, so the update is timed.
    assert "rl.skip_no_signal=false" in report["config"]["overrides"]
    for run in (report["sparse"], report["dense"]):
        assert not run["update_skipped"]
        assert run["update_s"] > 0
    assert report["problems"] == []


def test_a_skipped_update_fails_the_bench(report):
    bad = json.loads(json.dumps(report))
    bad["dense"]["update_skipped"] = True
    assert problems(bad) == ["the dense run skipped its update (every advantage zero)"]
    bad["dense"]["update_skipped"], bad["sparse"]["update_s"] = False, 0.0
    assert problems(bad) == ["the sparse run timed no update (update_s 0.0)"]


def test_step_bench_times_the_distill_update_and_reports_memory(report):
    sparse, dense = report["sparse"], report["dense"]
    # DistillSparse trains the sparse policy's adapter; a dense run has no sparse policy.
    assert sparse["distill"] and not dense["distill"]
    assert sparse["distill_s"] > 0
    for run in (sparse, dense):
        assert run["peak_gpu_gib"] is None  # CPU: no CUDA allocator to read
        assert run["process_peak_rss_gib"] > 0.1


def test_speedups_are_ratios_of_measured_phases(report):
    sparse, dense = report["sparse"], report["dense"]
    # Same token counts: the throughput ratios are the time ratios.
    assert report["rollout_speedup"] == pytest.approx(dense["rollout_s"] / sparse["rollout_s"])
    assert report["step_speedup"] == pytest.approx(dense["step_s"] / sparse["step_s"])
    excl = (dense["step_s"] - dense["monitor_s"]) / (sparse["step_s"] - sparse["monitor_s"])
    assert report["step_speedup_excl_monitor"] == pytest.approx(excl)


def test_override_replacement_keeps_one_assignment_per_key():
    got = _set(
        ["preset=tiny", "schedule=cpu_online", "+schedule=x", "rl.steps=2"], "schedule", "dense"
    )
    assert got == ["preset=tiny", "rl.steps=2", "schedule=dense"]


def test_cli_rejects_stray_arguments(capsys):
    assert cli.main(["step", "not-an-override"]) == 2
    assert "unrecognized arguments: not-an-override" in capsys.readouterr().err


def test_qwen3_shapes_match_the_public_configs():
    cfg = random_model_config("qwen3-1.7b")
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (2048, 28, 16)
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size) == (8, 128, 151936)
    assert random_model_config("qwen3-8b").tie_word_embeddings is False
    with pytest.raises(ValueError, match="unknown random model"):
        random_model_config("qwen3-70b")


def test_saved_random_model_loads_as_a_local_checkpoint(tmp_path):
    directory = save_random_model("qwen3-debug", tmp_path / "m", dtype="float32", seed=3)
    loaded = load_model(ModelConfig(name=str(directory)))
    ref = build_random_model("qwen3-debug", torch.float32, seed=3)
    ids = torch.tensor([[1, 5, 9, 700]])
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, ref.model(ids).logits)
    assert loaded.model.config.vocab_size == 1024 and len(loaded.tokenizer) < 1024


@pytest.mark.parametrize(("tag", "layers"), [("1p7b", 28), ("4b", 36), ("8b", 36)])
def test_gpu_presets_compose_with_the_papers_schedules(tag, layers):
    from sparrow.cli.config_loader import load_config

    cfg = load_config([f"preset=qwen3_{tag}_gpu"])
    assert cfg.model.dtype == "bfloat16" and cfg.rollout.engine.dtype == "bfloat16"
    assert cfg.schedule.mode == "fixed" and cfg.schedule.bin_tokens == 2000
    assert cfg.schedule.budgets_pages[0] == 32  # 512 tokens in the first 2K bin, every size
    assert cfg.actor.precision == "bf16" and cfg.rollout.max_new_tokens == 32768
    shape = random_model_config(f"qwen3-{tag.replace('p', '.')}")
    assert shape.num_hidden_layers == layers


@pytest.mark.slow  # two more trainers, a step each
def test_forwards_compares_one_dense_forward_with_two(tmp_path):
    """--forwards: the same sparse step with rl.dense_pass=update and =separate; the separate
    pass is a phase of the second arm only, and the ratio is that of the measured steps."""
    path = tmp_path / "forwards.json"
    argv = ["step", "--forwards", "--json", str(path), "preset=tiny", "rollout.max_new_tokens=8"]
    assert cli.main(argv) == 0
    report = json.loads(path.read_text())
    one, two = report["one_forward"], report["two_forwards"]
    assert "logprobs" not in one["phases"] and two["logprobs_s"] > 0
    assert report["forward_ratio"] == pytest.approx(two["step_s"] / one["step_s"])
    assert report["forward_phase_ratios"]["update"] == pytest.approx(
        two["update_s"] / one["update_s"]
    )
    assert one["prompt_len_mean"] == two["prompt_len_mean"]  # same seed, same prompts
    assert report["problems"] == []
    # An arm that did not do its work fails the bench.
    bad = json.loads(json.dumps(report))
    bad["one_forward"]["phases"].insert(1, "logprobs")
    bad["two_forwards"]["logprobs_s"] = 0.0
    assert problems(bad) == [
        "the one_forward run ran a separate log-prob pass (rl.dense_pass fell back)",
        "the two_forwards run timed no separate log-prob pass",
    ]
