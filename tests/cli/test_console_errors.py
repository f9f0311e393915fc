"""Every console script's bad input is one line naming the key, option or file, and exit 2.

Each case drives a script's main() in process (a tiny model at most) and checks the whole of
stderr: no traceback, exactly one `prog: ...` line, last, naming what to change. The cases are
those that used to end otherwise: a missing model in sparrow-generate (a hub id or a folder: 4
chained tracebacks), non-UTF-8 prompts or training data (no file or row named), an option value
that is not a number or out of its bounds (`--budgets 16,abc`, `--budgets 100000`, a KV pool that
holds no prompt), a model family the engine does not run or a model directory whose weights are
cut short (a traceback), an empty metrics file for sparrow-report (exit 1), and values of
sparrow-train keys that crashed the run later (`logger.console_every=0`, ...) or were refused
without the key.
"""

import logging
import sys

import pytest

from sparrow.bench import cli as bench
from sparrow.cli import calibrate, generate, report, train

ENV_DIST = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
TINY = ["preset=tiny", "rl.steps=1", "rl.eval.every=0"]


@pytest.fixture(autouse=True)
def _offline_and_fresh_logging(monkeypatch):
    """No hub requests (the hub read its environment at import); a clean root logger."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    handlers = logging.root.handlers[:]
    logging.root.handlers.clear()
    yield
    logging.root.handlers[:] = handlers


def one_line(capsys, main, argv, prog: str) -> str:
    """Run `main(argv)`: exit code 2 and a single `prog: error...` line ending stderr."""
    # datasets, transformers and huggingface_hub bind their handlers to the stderr of the test
    # that first imported them, a capture that is closed by now.
    for logger in map(logging.getLogger, list(logging.Logger.manager.loggerDict)):
        for handler in getattr(logger, "handlers", []):
            if type(handler) is logging.StreamHandler:
                handler.stream = sys.stderr
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if line.startswith(f"{prog}:")]
    assert len(lines) == 1 and err.rstrip().endswith(lines[0]), err
    return lines[0]


@pytest.fixture
def non_utf8_jsonl(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(b'{"prompt": "2 + 2?", "answer": "4"}\n{"prompt": "hi \xff", "answer": "1"}\n')
    return path


# ---- sparrow-generate ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["nonexistent-org/no-such-model", "{tmp}/no/such/folder"])
def test_generate_missing_model_names_the_option(capsys, tmp_path, name):
    name = name.format(tmp=tmp_path)
    argv = ["--model", name, "--out", str(tmp_path / "out.jsonl")]
    line = one_line(capsys, generate.main, argv, "sparrow-generate")
    assert line.startswith(f"sparrow-generate: error: cannot load --model='{name}' (")
    assert line.endswith("give a local model directory or a hub id present in the HF cache")


def test_generate_non_utf8_prompts_names_file_line_and_row(capsys, tmp_path, non_utf8_jsonl):
    argv = ["--model", "tiny-qwen3", "--prompts", str(non_utf8_jsonl), "--out", str(tmp_path / "o")]
    line = one_line(capsys, generate.main, argv, "sparrow-generate")
    assert f"{non_utf8_jsonl} line 2 (row 1), byte 16 (0xff) is not UTF-8 text" in line


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--budget-tokens", "100000"], "--budget-tokens 100000: must be between one page"),
        (["--num-pages", "2"], "--num-pages 2 cannot hold the longest prompt"),
        (["--limit", "y"], "argument --limit: 'y' is not an integer"),
        (["--n", "0"], "argument --n: 0 is below 1"),
        (["--top-p", "0"], "--top-p 0.0"),
    ],
)
def test_generate_values_out_of_bounds_name_the_option(capsys, tmp_path, args, expected):
    argv = ["--model", "tiny-qwen3", "--limit", "2", "--out", str(tmp_path / "o"), *args]
    assert expected in one_line(capsys, generate.main, argv, "sparrow-generate")


@pytest.fixture
def gpt2_dir(tmp_path):
    """A tiny GPT-2 saved as an HF directory: a family sparrow's engine does not run."""
    import transformers

    from sparrow.models.loading import tiny_tokenizer

    # Token ids inside the vocabulary: transformers warns of others (into a closed capture).
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=512, bos_token_id=0, eos_token_id=0
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    tiny_tokenizer().save_pretrained(tmp_path / "gpt2")
    return tmp_path / "gpt2"


def test_generate_refused_model_family_is_one_line(capsys, tmp_path, gpt2_dir):
    argv = ["--model", str(gpt2_dir), "--limit", "2", "--max-tokens", "4"]
    line = one_line(
        capsys, generate.main, [*argv, "--out", str(tmp_path / "o")], "sparrow-generate"
    )
    assert line.startswith(f"sparrow-generate: error: --model {gpt2_dir}: model_type 'gpt2' not")


def test_generate_truncated_weights_name_the_directory(capsys, tmp_path, gpt2_dir):
    weights = gpt2_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    argv = ["--model", str(gpt2_dir), "--limit", "2", "--out", str(tmp_path / "o")]
    line = one_line(capsys, generate.main, argv, "sparrow-generate")
    assert f"error: {gpt2_dir}: the model's weights cannot be read (" in line


# ---- sparrow-calibrate --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--budgets", "16,abc"],
            "error: argument --budgets: 'abc' in '16,abc' is not a whole number of pages",
        ),
        (
            ["--budgets", "100000"],
            "error: --budgets 100000: each budget must be between 1 page and the KV pool "
            "(rollout.engine.num_pages=256)",
        ),
        (["--budgets", "0,4"], "error: --budgets 0,4: each budget must be between 1 page"),
        (["--samples", "0"], "error: argument --samples: 0 is below 1"),
        (
            ["--budgets", "2", "--prompts", "2", "rollout.engine.num_pages=5"],
            "error: rollout.engine.num_pages=5 cannot hold one prompt's measurement: 2 samples",
        ),
    ],
)
def test_calibrate_bad_option_names_it(capsys, tmp_path, args, expected):
    argv = ["preset=tiny", "--out", str(tmp_path), *args]
    assert expected in one_line(capsys, calibrate.main, argv, "sparrow-calibrate")


# ---- sparrow-report -----------------------------------------------------------------------------


def test_report_on_an_empty_metrics_file_is_one_line(capsys, tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    line = one_line(capsys, report.main, [str(tmp_path)], "sparrow-report")
    assert line == (
        f"sparrow-report: error: {tmp_path}/metrics.jsonl: no metrics rows (has the run logged a "
        "step yet?)"
    )


# ---- sparrow-train ------------------------------------------------------------------------------


def test_train_non_utf8_data_names_file_line_and_row(capsys, tmp_path, non_utf8_jsonl):
    argv = [*TINY, f"run_dir={tmp_path}/run", "data=jsonl", f"data.source={non_utf8_jsonl}"]
    line = one_line(capsys, train.main, argv, "sparrow-train")
    assert f"error: {non_utf8_jsonl} line 2 (row 1), byte 16 (0xff) is not UTF-8 text" in line


def test_train_non_utf8_csv_counts_rows_after_the_header(capsys, tmp_path):
    path = tmp_path / "prompts.csv"
    path.write_bytes(b'prompt,answer\n"2 + 2?",4\n"3 + 3?",6\n"hi \xff",1\n')
    argv = [*TINY, f"run_dir={tmp_path}/run", "data=jsonl", f"data.source={path}"]
    line = one_line(capsys, train.main, argv, "sparrow-train")
    assert f"error: {path} line 4 (row 2), byte 5 (0xff) is not UTF-8 text" in line


def test_train_pool_holding_no_prompt_names_the_key_and_the_value_that_fits(capsys, tmp_path):
    argv = [*TINY, f"run_dir={tmp_path}", "rollout.engine.num_pages=2"]
    line = one_line(capsys, train.main, argv, "sparrow-train")
    # The tiny preset's prompts have 30..32 tokens; completions 16: 46 tokens, 3 pages of 16.
    assert line == (
        "sparrow-train: error: rollout.engine.num_pages=2 (32 tokens) holds no prompt with a "
        "16-token completion (rollout.max_new_tokens, rl.eval.max_new_tokens): the shortest "
        "prompt has 30 tokens; raise rollout.engine.num_pages to at least 3"
    )


@pytest.mark.parametrize(
    "override, expected",
    [
        ("logger.console_every=0", "logger.console_every must be >= 1, got 0"),
        ("rollout.engine.max_batch_size=0", "rollout.engine.max_batch_size and max_prefill_tokens"),
        ("rl.eval.max_new_tokens=0", "rl.eval.max_new_tokens must be >= 1, got 0"),
        ("rl.eval.temperature=-1", "rl.eval.every, rl.eval.num_prompts and rl.eval.temperature"),
        ("actor.lr=-1", "actor.lr must be >= 0, got -1.0"),
        ("rl.prompts_per_step=0", "rl.prompts_per_step must be >= 1"),
        ("rl.keep_last=0", "rl.keep_last must be >= 1"),
    ],
)
def test_train_value_out_of_bounds_is_a_config_error_naming_the_key(
    capsys, tmp_path, override, expected
):
    line = one_line(capsys, train.main, [*TINY, f"run_dir={tmp_path}", override], "sparrow-train")
    assert line.startswith("sparrow-train: config error: ") and expected in line


# ---- sparrow-bench ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["kernel", "--batch", "0"], "argument --batch: 0 is below 1"),
        (["kernel", "--q-heads", "3", "--kv-heads", "2"], "--q-heads 3 must be a multiple of"),
        (["prefix", "--model", "nonexistent-org/no-such-model"], "cannot load --model="),
        (["decode", "--lens", "0"], "argument --lens: 0 is below 1"),
    ],
)
def test_bench_bad_option_is_one_line(capsys, argv, expected, monkeypatch):
    for name in ENV_DIST:
        monkeypatch.delenv(name, raising=False)
    assert expected in one_line(capsys, bench.main, argv, "sparrow-bench")


def test_bench_help_still_exits_zero(capsys):
    with pytest.raises(SystemExit) as done:
        bench.main(["kernel", "--help"])
    assert done.value.code == 0
    assert "usage: sparrow-bench kernel" in capsys.readouterr().out
