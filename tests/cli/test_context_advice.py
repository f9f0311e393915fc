"""The advice for prompts that no run could hold never points past the model's positions.

A prompt longer than the model's context (the issue's 70K-token prompt against Qwen3's 40,960
positions) is to be shortened or dropped: no KV pool holds it, so a larger
`rollout.engine.num_pages` / `--num-pages` is not advice. Checked on `ContextRoom` over a grid of
sizes, and once each through sparrow-train and sparrow-generate (the tiny model's 4,096
positions): exit 2, one line.
"""

import json
import logging
import re
import sys

import pytest

from sparrow.cli import generate
from sparrow.cli.train import main
from sparrow.tasks.data import PromptsTooLong
from sparrow.train.memory.context_budget import ContextRoom

QWEN3_POSITIONS = 40960


@pytest.fixture(autouse=True)
def _fresh_logging():
    """Loaders' log handlers bind the stderr of the test that created them: rebind to this one."""
    for logger in map(logging.getLogger, list(logging.Logger.manager.loggerDict)):
        for handler in getattr(logger, "handlers", []):
            if type(handler) is logging.StreamHandler:
                handler.stream = sys.stderr


def _advice(room: ContextRoom, shortest: int) -> str:
    return str(room.too_long(PromptsTooLong("all prompts too long", shortest)))


def test_a_prompt_over_the_models_positions_is_to_be_shortened_or_dropped():
    room = ContextRoom(completion_tokens=1024, num_pages=2048, page_size=16, positions=40960)
    line = _advice(room, 70_000)
    assert "num_pages" not in line, line
    assert line == (
        "the shortest prompt has 70000 tokens, over the model's 40960 positions, which no KV pool "
        "extends: shorten the prompts or drop those rows (with a 1024-token completion "
        "(rollout.max_new_tokens, rl.eval.max_new_tokens) a prompt may have 39936 tokens)"
    )


@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("num_pages", [64, 512, 4096])
@pytest.mark.parametrize("completion", [256, 8192])
@pytest.mark.parametrize("shortest", [1_000, 30_000, 39_000, 40_959, 70_000])
def test_no_advice_exceeds_the_models_context(page_size, num_pages, completion, shortest):
    room = ContextRoom(completion, num_pages, page_size, QWEN3_POSITIONS)
    if room.tokens >= shortest:
        return  # the prompt fits: data.max_prompt_tokens is what binds
    line = _advice(room, shortest)
    pages = re.search(r"num_pages to at least (\d+)", line)
    if pages:  # the pool it names holds the prompt and its completion within the positions
        assert shortest + completion <= QWEN3_POSITIONS, line
        assert (int(pages[1]) - 1) * page_size < QWEN3_POSITIONS, line
    lower = re.search(r"max_new_tokens to at most (\d+)", line)
    if lower:
        assert shortest + int(lower[1]) <= QWEN3_POSITIONS, line
    if shortest >= QWEN3_POSITIONS:
        assert "shorten the prompts or drop those rows" in line and not (pages or lower), line
    assert pages or lower or "shorten the prompts" in line, line


def _jsonl(tmp_path, rows: list[dict]):
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _one_error_line(capsys, prog: str) -> str:
    """The one line `prog` printed on stderr, which ends it, with no traceback."""
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith(f"{prog}:")]
    assert "Traceback" not in err and len(lines) == 1 and err.rstrip().endswith(lines[0]), err
    return lines[0]


def test_train_with_prompts_over_the_models_positions_is_one_line(capsys, tmp_path):
    # tiny-qwen3 has 4,096 positions; a 16-page pool (256 tokens) holds none of these prompts,
    # and before the fix the line said to raise num_pages past the model's positions.
    rows = [
        {"prompt": "blue red " * 2500 + f"What is {i} + 1?", "answer": str(i + 1)} for i in range(2)
    ]
    data = _jsonl(tmp_path, rows)
    argv = [
        "preset=tiny",
        "rl.steps=1",
        "rl.eval.every=0",
        f"run_dir={tmp_path / 'run'}",
        "data=jsonl",
        f"data.source={data}",
        f"data.eval_source={data}",
        "rollout.engine.num_pages=16",
    ]
    assert main(argv) == 2
    line = _one_error_line(capsys, "sparrow-train")
    assert re.fullmatch(
        r"sparrow-train: error: the shortest prompt has \d+ tokens, over the model's 4096 "
        r"positions, which no KV pool extends: shorten the prompts or drop those rows \(with a "
        r"16-token completion \(rollout.max_new_tokens, rl.eval.max_new_tokens\) a prompt may "
        r"have 4080 tokens\)",
        line,
    ), line


def test_generate_with_a_prompt_over_the_models_positions_is_one_line(capsys, tmp_path):
    rows = [
        {"prompt": "blue red " * 2500 + "What is 1 + 1?", "answer": "2"},
        {"prompt": "What is 2 + 2?", "answer": "4"},
    ]
    data = _jsonl(tmp_path, rows)
    argv = [
        "--model",
        "tiny-qwen3",
        "--prompts",
        str(data),
        "--max-prompt-tokens",
        "10000",
        "--max-tokens",
        "16",
        "--num-pages",
        "16",
        "--out",
        str(tmp_path / "out.jsonl"),
    ]
    assert generate.main(argv) == 2
    line = _one_error_line(capsys, "sparrow-generate")
    assert re.fullmatch(
        r"sparrow-generate: error: the longest prompt has \d+ tokens: with --max-tokens 16 it is "
        r"over the model's 4096 positions, which no KV pool extends; shorten that prompt or drop "
        r"its row \(--max-prompt-tokens 4080 skips the rows over that\)",
        line,
    ), line
