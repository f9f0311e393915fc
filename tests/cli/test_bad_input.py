"""Bad input ends in one clear line or a counted skip, never in a traceback or a lost run.

Drives `sparrow-train`'s main() in process (so each case costs a model load, not an interpreter
start): malformed configs and overrides, data files that are missing, empty or of the wrong
types, a tokenizer without a chat template, prompts longer than the context window, and a reward
that raises or hangs inside a real training step. The loader-level cases live in
tests/tasks/test_data.py, the reward guard's in tests/tasks/test_rewards.py.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.cli.config_loader import conf_dir, load_config
from sparrow.cli.train import main
from sparrow.models.loading import ModelConfig, load_model
from sparrow.tasks.data import DataConfig, load_prompts
from sparrow.tasks.rewards import REWARDS, RewardResult, register_reward
from sparrow.train.trainer import GRPOTrainer

TINY = ["preset=tiny", "rl.steps=1", "rl.eval.every=0"]


@pytest.fixture(autouse=True)
def _fresh_logging(capsys):
    """Log handlers bind the stderr of the test that created them (main() calls basicConfig,
    datasets adds its own): point them at this test's captured stderr."""
    handlers = logging.root.handlers[:]
    logging.root.handlers.clear()
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)]
    for handler in (h for logger in loggers for h in logger.handlers):
        if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", 0):
            handler.stream = sys.stderr  # setStream would flush the closed one
    yield
    logging.root.handlers[:] = handlers


def _one_error_line(capsys, argv: list[str], code: int = 2) -> str:
    """The single line sparrow-train printed for the error (progress bars of third-party
    loaders aside), after checking that there is no traceback."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line.startswith("sparrow-train:")]
    assert len(lines) == 1 and err.rstrip().endswith(lines[0]), err
    return lines[0]


# ---- configs and overrides --------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, expected",
    [
        ("rl.steps", "config error: Error parsing override 'rl.steps'"),
        ("=3", "config error: Config group override must be a string or a list"),
        ("rl.steps=[1,2", "config error: no viable alternative at input '[1,2'"),
        ("actor.zero_stage=7", "config error: zero_stage must be 0-3, got 7"),
        ("logger.wandb.mode=bogus", "config error: logger.wandb.mode='bogus': expected one of"),
    ],
)
def test_malformed_override_is_one_line(capsys, override, expected):
    assert expected in _one_error_line(capsys, ["preset=tiny", override])


def test_malformed_yaml_file_is_one_line_naming_it(capsys, tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    (conf / "rl" / "cpu_default.yaml").write_text("steps: [1, 2\nfoo: : bar\n")
    monkeypatch.setenv("SPARROW_CONF", str(conf))
    line = _one_error_line(capsys, ["preset=tiny"])
    assert "config error: malformed YAML" in line and f"{conf}/rl/cpu_default.yaml" in line


@pytest.mark.parametrize(
    "override, expected",
    [
        ("rl.prompts_per_step=65", "error: batch size 65 must be between 1 and the 64 prompts"),
    ],
)
def test_value_rejected_by_a_component_is_one_line(capsys, tmp_path, override, expected):
    assert expected in _one_error_line(capsys, [*TINY, f"run_dir={tmp_path}", override])


@pytest.mark.parametrize("override", ["rl.group_size=0", "rollout.temperature=-1"])
def test_value_rejected_by_the_rollout_is_a_config_error(capsys, tmp_path, override):
    assert "config error" in _one_error_line(capsys, [*TINY, f"run_dir={tmp_path}", override])


# ---- data ---------------------------------------------------------------------------------------


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    "case, expected",
    [
        ("unset", "error: data.source is not set"),
        ("missing", "error: data file not found: {dir}/missing.jsonl"),
        ("empty", "error: dataset {dir}/empty.jsonl (split 'train') is empty"),
        ("int_prompts", "error: row 0 of {dir}/ints.jsonl: prompt column 'prompt' must hold"),
        ("no_answer_column", "error: answer column 'answer' not found in {dir}/q.jsonl"),
    ],
)
def test_bad_dataset_is_one_line_naming_it(capsys, tmp_path, case, expected):
    sources = {
        "unset": None,
        "missing": str(tmp_path / "missing.jsonl"),
        "empty": _jsonl(tmp_path / "empty.jsonl", []),
        "int_prompts": _jsonl(
            tmp_path / "ints.jsonl", [{"prompt": i, "answer": i} for i in range(8)]
        ),
        "no_answer_column": _jsonl(tmp_path / "q.jsonl", [{"prompt": "hi", "solution": "1"}] * 8),
    }
    argv = [*TINY, f"run_dir={tmp_path / 'run'}", "data=jsonl"]
    if sources[case] is not None:
        argv.append(f"data.source={sources[case]}")
    assert expected.format(dir=tmp_path) in _one_error_line(capsys, argv)


def test_unparsable_file_is_one_line_naming_its_line_row_and_reason(tmp_path):
    # A real process: datasets would log the parse failure through its own handler, which
    # captured streams of earlier in-process tests would break.
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": \n{{{\n')
    cmd = [sys.executable, "-m", "sparrow.cli.train", *TINY, f"run_dir={tmp_path / 'run'}"]
    cmd += ["data=jsonl", f"data.source={broken}"]
    # A fresh single-process run: drop the rendezvous variables of the in-process trainers.
    dist_vars = (
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
    )
    env = {k: v for k, v in os.environ.items() if k not in dist_vars}
    env |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert out.returncode == 2, out.stderr
    # The whole of stderr: no progress bar, no log line of datasets' above it (issue 61 item 10).
    assert out.stderr == (
        f"sparrow-train: error: {broken} line 2 (row 1) is not JSON (Expecting value: column "
        "27): fix or remove that line\n"
    )


def test_tokenizer_without_chat_template_is_one_line(capsys, tmp_path):
    tiny = load_model(ModelConfig("tiny-qwen3"))
    tiny.tokenizer.chat_template = None
    tiny.model.save_pretrained(tmp_path / "model")
    tiny.tokenizer.save_pretrained(tmp_path / "model")
    argv = [*TINY, f"run_dir={tmp_path / 'run'}", f"model.name={tmp_path / 'model'}"]
    line = _one_error_line(capsys, argv)
    assert "the tokenizer has no chat template; set data.chat_template=false" in line


def test_prompts_over_the_context_room_are_skipped_and_counted():
    tokenizer = load_model(ModelConfig("tiny-qwen3")).tokenizer
    cfg = DataConfig(source="tasks")
    cfg.tasks.kind, cfg.tasks.num_examples, cfg.tasks.num_heldout = "long_context", 12, 2
    cfg.tasks.context_words, cfg.tasks.context_jitter = 150, 0.5
    lengths = sorted(len(p.token_ids) for p in load_prompts(cfg, tokenizer).prompts)
    room = lengths[len(lengths) // 2]
    data = load_prompts(cfg, tokenizer, context_tokens=room)
    assert 0 < data.num_skipped_too_long == sum(n > room for n in lengths)
    assert max(len(p.token_ids) for p in data.prompts) <= room
    assert f"skipped {data.num_skipped_too_long} of 12 longer than {room} tokens" in data.summary()


def test_train_skips_a_prompt_longer_than_the_kv_pool(capsys, tmp_path):
    # A 16-page pool holds 256 tokens: the long row plus 16 new tokens cannot fit.
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(7)]
    rows.append({"prompt": "blue red " * 150 + "What is 1 + 1?", "answer": "2"})
    argv = [
        *TINY,
        f"run_dir={tmp_path / 'run'}",
        "data=jsonl",
        f"data.source={_jsonl(tmp_path / 'd.jsonl', rows)}",
        f"data.eval_source={tmp_path / 'd.jsonl'}",  # train on all 8 rows, none held out
        "rl.prompts_per_step=2",
        "rollout.engine.num_pages=16",
    ]
    assert main(argv) == 0
    assert "skipped 1 of 8 longer than" in capsys.readouterr().out


# ---- rewards inside a real step ---------------------------------------------------------------


def _raising(prompt, completion, reference):
    raise RuntimeError("reward service down")


_HANG_FINISHED = []  # calls of _hanging that returned: none may before the step ends


def _hanging(prompt, completion, reference):
    time.sleep(300)
    _HANG_FINISHED.append(1)
    return RewardResult(1.0)


@pytest.mark.parametrize(
    "name, counter", [("raises", "reward/errors"), ("hangs", "reward/timeouts")]
)
def test_faulty_reward_is_counted_and_the_step_completes(tmp_path, name, counter):
    if f"test_{name}" not in REWARDS:
        register_reward(
            f"test_{name}", lambda cfg, fn=_raising if name == "raises" else _hanging: fn
        )
    cfg = load_config(
        [*TINY, f"run_dir={tmp_path}", f"rl.reward.name=test_{name}", "rl.reward.timeout_s=0.05"]
    )
    trainer = GRPOTrainer.from_config(cfg)
    trainer.fit()
    assert not _HANG_FINISHED  # 16 completions: each cut at the deadline, none waited for
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["step"] == 1 and row[counter] == 16.0 and row["reward/mean"] == 0.0
    assert (tmp_path / "checkpoints" / "step_000001" / "COMPLETE").is_file()
