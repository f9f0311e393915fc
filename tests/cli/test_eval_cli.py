"""sparrow-eval (issue 50): a saved policy scored without training. A tiny one-step run made here
(preset=tiny, with k=2 evaluation samples) exports the policy; sparrow-eval then reproduces the
run's last greedy evaluation from its run dir, prints pass@j and mean@k beside it, samples them
from the stream --seed names, scores a file, and stops on bad input with one line and exit 2."""

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.cli.eval_policy import main
from sparrow.rollout.engine import LLMEngine

ROOT = Path(__file__).resolve().parents[2]
REWARD = "tests/data/my_reward.py:score"
_DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
# The trainer's console line of an evaluation (sparrow/train/step_report.py format_eval_line).
_EVAL_LINE = re.compile(
    r"eval step 1: accuracy ([\d.]+) \(95% CI ([\d.]+)-([\d.]+), n=(\d+)\), "
    r"mean length ([\d.]+)(.*)"
)
_INTERVAL = r"[\d.]+ \([\d.]+-[\d.]+\)"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, re.Match]:
    """A one-step tiny run and its last evaluation line."""
    run_dir = tmp_path_factory.mktemp("tiny_run")
    env = {k: v for k, v in os.environ.items() if k not in _DIST_VARS}
    env |= {"HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true"}
    overrides = ["preset=tiny", "rl.steps=1", "rl.eval.samples=2", "rl.eval.temperature=1.0"]
    # The user's reward by a path relative to the checkout, as the README's gsm8k run gives it.
    overrides.append(f"rl.reward.function={REWARD}")
    out = subprocess.run(
        [sys.executable, "-m", "sparrow.cli.train", *overrides, f"run_dir={run_dir}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (last,) = [m for m in map(_EVAL_LINE.search, out.stdout.splitlines()) if m]
    return run_dir, last


def test_training_evaluates_k_samples_beside_greedy_accuracy(tiny_run):
    _, last = tiny_run
    # after the paired change since the first evaluation
    assert re.search(rf"; mean@2 {_INTERVAL}; pass@2 {_INTERVAL}$", last.group(6))


def test_eval_reproduces_the_runs_last_greedy_evaluation(tiny_run, capsys):
    run_dir, last = tiny_run
    accuracy, lo, hi, n, length, _ = last.groups()
    # The run's own config, greedy with one sample: what its evaluation's accuracy scored.
    assert main([str(run_dir), "--samples", "1", "--temperature", "0"]) == 0
    expected = f"accuracy {accuracy} (95% CI {lo}-{hi}, n={n})"
    assert capsys.readouterr().out.splitlines() == [expected]
    assert main([str(run_dir / "policy"), "--samples", "1", "--temperature", "0", "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert f"{scored['eval/accuracy']:.3f}" == accuracy and scored["eval/n"] == int(n)
    assert f"{scored['eval/len_mean']:.1f}" == length  # the same completions' lengths


def test_eval_prints_pass_at_j_and_mean_at_k_with_their_cis(tiny_run, capsys):
    run_dir, _ = tiny_run
    assert main([str(run_dir), "--samples", "4", "--temperature", "1.0", "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    for name in ("accuracy", "mean@4", "pass@2", "pass@4"):
        lo, value, hi = (scored[f"eval/{name}{s}"] for s in ("_lo95", "", "_hi95"))
        assert 0.0 <= lo <= value <= hi <= 1.0 and hi > lo, (name, lo, value, hi)
    assert main([str(run_dir)]) == 0  # the run's own k = 2
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["accuracy", "mean@2", "pass@2"]
    assert all(re.fullmatch(r"\S+ [\d.]+ \(95% CI [\d.]+-[\d.]+, n=8\)", line) for line in lines)


def test_seed_chooses_the_sampled_completions(tiny_run, capsys, monkeypatch):
    """--seed S is the k samples' stream: two seeds draw different completions, the same seed
    the same ones (read from the engine's generate, which the metrics alone may not tell)."""
    run_dir, _ = tiny_run
    sampled: list[list[tuple[int, ...]]] = []
    real_generate = LLMEngine.generate

    def recording(self, prompt_ids, params, n=1, **kwargs):
        outputs = real_generate(self, prompt_ids, params, n=n, **kwargs)
        if n > 1:  # the k-sample pass, not greedy accuracy's
            sampled.append([tuple(o.token_ids) for o in outputs])
        return outputs

    monkeypatch.setattr(LLMEngine, "generate", recording)
    for seed in (1, 2, 1):
        argv = [str(run_dir), "--samples", "4", "--temperature", "1.0", "--limit", "4"]
        assert main([*argv, "--seed", str(seed), "--json"]) == 0
    capsys.readouterr()
    first, other, again = sampled
    assert len(first) == 16 and first == again
    assert first != other, "--seed 1 and --seed 2 drew the same completions"


def test_eval_scores_every_row_of_a_file(tiny_run, tmp_path, capsys):
    run_dir, _ = tiny_run
    rows = [{"question": f"What is {a} + 2?", "solution": str(a + 2)} for a in range(5)]
    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = [str(run_dir), "--prompts", str(data), "--column", "question", "--samples", "1"]
    assert main([*argv, "--answer-column", "solution", "--temperature", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["eval/n"] == 5


def test_eval_from_another_directory_finds_the_runs_reward(tiny_run, tmp_path, monkeypatch, capsys):
    """The run dir stores its relative reward path resolved, so it is read from anywhere."""
    run_dir, last = tiny_run
    stored = json.loads((run_dir / "run_config.json").read_text())["rl"]["reward"]["function"]
    assert stored == f"{ROOT / REWARD}"
    monkeypatch.chdir(tmp_path)
    assert main([str(run_dir), "--samples", "1", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith(f"accuracy {last.group(1)} ")


def _copy_run(run_dir: Path, to: Path, reward: str | None = None) -> Path:
    """The run's config and exported policy copied to `to` (its reward path replaced)."""
    shutil.copytree(run_dir / "policy", to / "policy")
    stored = json.loads((run_dir / "run_config.json").read_text())
    if reward is not None:
        stored["rl"]["reward"]["function"] = reward
    (to / "run_config.json").write_text(json.dumps(stored))
    return to


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing", "no policy at"),
        ("unfinished_run", "holds no exported policy"),
        ("bad_file", "test.jsonl"),
        ("missing_file", "no_such.jsonl"),
        ("bad_column", "prompt column 'nope' not found"),
        ("greedy_samples", "rl.eval.samples=3 at rl.eval.temperature=0.0"),
        ("reward_deleted", "gone.py:score': no such file"),
        ("reward_relative", "(a relative path is taken from the current directory"),
        ("weights_missing", "the model's weights cannot be read (Error no file named"),
        ("weights_truncated", "the model's weights cannot be read (Error while deserializing"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_run, tmp_path, capsys, monkeypatch, case, expected):
    run_dir, _ = tiny_run
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "run_config.json").write_text((run_dir / "run_config.json").read_text())
    bad = tmp_path / "test.jsonl"
    bad.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\nnot json at all\n')
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "What is 1 + 1?", "answer": "2"}\n')
    copied = _copy_run(
        run_dir,
        tmp_path / "copy",
        {
            "reward_deleted": f"{tmp_path}/gone.py:score",
            "reward_relative": REWARD,  # as an older sparrow stored it; read from elsewhere
        }.get(case),
    )
    weights = copied / "policy" / "model.safetensors"
    if case == "weights_missing":
        weights.unlink()
    if case == "weights_truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    if case == "reward_relative":
        monkeypatch.chdir(tmp_path)
    argv = {
        "reward_deleted": [str(copied)],
        "reward_relative": [str(copied)],
        "weights_missing": [str(copied)],
        "weights_truncated": [str(copied)],
        "missing": [str(tmp_path / "nope")],
        "unfinished_run": [str(unfinished)],
        "bad_file": [str(run_dir), "--prompts", str(bad)],
        "missing_file": [str(run_dir), "--prompts", str(tmp_path / "no_such.jsonl")],
        "bad_column": [str(run_dir), "--prompts", str(good), "--column", "nope"],
        "greedy_samples": [str(run_dir), "--samples", "3", "--temperature", "0"],
    }[case]
    # As tests/cli/test_console_errors.py reads it: the libraries' progress bars and log lines
    # may come first (datasets' handlers are bound to the stderr of the test that imported it).
    for logger in map(logging.getLogger, list(logging.Logger.manager.loggerDict)):
        for handler in getattr(logger, "handlers", []):
            if type(handler) is logging.StreamHandler:
                handler.stream = sys.stderr
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line.startswith("sparrow-eval:")]
    assert len(lines) == 1 and err.rstrip().endswith(lines[0]), err
    assert lines[0].startswith("sparrow-eval: error: ") and expected in lines[0], lines
