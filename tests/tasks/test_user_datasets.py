"""Datasets as users have them (issue 50 item 3): answer extractors, prompt templates, system
prompts and message lists through a real (ChatML) chat template, bad rows skipped and counted,
a file of bad rows refused in one line with exit 2, and the shipped GSM8K-shaped sample."""

import json
import logging
import sys
from pathlib import Path

import pytest

from sparrow.cli.train import main
from sparrow.models.loading import tiny_tokenizer
from sparrow.tasks.answer_extractors import extract_answer
from sparrow.tasks.data import DataConfig, DataError, load_prompts

ROOT = Path(__file__).resolve().parents[2]
GSM8K_MINI = ROOT / "examples" / "gsm8k_mini.jsonl"


@pytest.fixture(scope="module")
def chatml():
    """The tiny models' byte-level tokenizer, with SmolLM2's and Qwen3's ChatML template."""
    return tiny_tokenizer()


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    "cell, expected",
    [
        (
            "She sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\nShe makes 9 * 2 = $<<9*2=18>>18.\n#### 18",
            "18",
        ),
        ("Step 1 #### not this\n#### 1,200", "1200"),  # the last ####; thousands comma dropped
        ("It is 3 less.\n#### -3", "-3"),
        ("#### 2.5", "2.5"),
        ("The answer is 18.", None),  # no ####
        ("work...\n####   ", None),  # nothing after it
        (None, None),
    ],
)
def test_gsm8k_extractor_takes_what_follows_the_last_hashes(cell, expected):
    assert extract_answer("gsm8k", cell) == expected


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("(3, 4)", "(3, 4)"),  # a pair: its comma is no thousands separator
        ("3, 4", "3, 4"),
        ("3,4", "3,4"),
        ("1,2345", "1,2345"),  # four digits after it: not a thousands group
        ("x = \\frac{1}{2}, y = -0.5", "x = \\frac{1}{2}, y = -0.5"),
        ("$1,234,567.50", "$1234567.50"),  # every thousands comma goes, nothing else
        ("(1,000, 2,000)", "(1000, 2000)"),
    ],
)
def test_gsm8k_extractor_drops_only_thousands_separators(answer, expected):
    assert extract_answer("gsm8k", f"work...\n#### {answer}") == expected


@pytest.mark.parametrize(
    "cell, expected",
    [
        ("So $x = \\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{\\sqrt{\\frac{a}{b^{2}}}}", "\\sqrt{\\frac{a}{b^{2}}}"),  # deeper nesting
        ("first \\boxed{3}, then \\boxed{ 4 }", "4"),  # the last box, stripped
        ("\\fbox{7}", "7"),
        ("unclosed \\boxed{\\frac{1}{2}", None),
        ("\\boxed{}", None),
        ("no box, just 5", None),
    ],
)
def test_boxed_extractor_takes_the_last_balanced_box(cell, expected):
    assert extract_answer("boxed", cell) == expected


def test_none_extractor_keeps_the_cell_as_it_is():
    assert extract_answer("none", " 42 ") == "42"
    assert extract_answer("none", 18) == "18"  # numbers become strings
    assert extract_answer("none", "#### 5") == "#### 5"
    assert extract_answer("none", "") is None and extract_answer("none", None) is None


def test_config_refuses_unknown_extractor_and_conflicting_or_empty_prompt_settings():
    with pytest.raises(ValueError, match=r"answer_extractor='math' is not one of \['boxed', "):
        DataConfig(answer_extractor="math")
    with pytest.raises(ValueError, match="data.template or data.messages_column, not both"):
        DataConfig(template="{q}", messages_column="messages")
    with pytest.raises(ValueError, match="has no {column} field"):
        DataConfig(template="Solve this.")


def test_template_fills_columns_under_a_system_prompt_in_the_chat_template(chatml, tmp_path):
    rows = [{"question": "What is 2 + 3?", "unit": "apples", "answer": "#### 5"}]
    cfg = DataConfig(
        source=_write_jsonl(tmp_path / "t.jsonl", rows),
        template="Solve: {question} ({unit}, {{literal}}) Put it in \\boxed{}.",
        system_prompt="Be brief.",
        answer_extractor="gsm8k",
        heldout_fraction=0.0,
    )
    (prompt,) = load_prompts(cfg, chatml).prompts
    assert prompt.text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
        "Solve: What is 2 + 3? (apples, {literal}) Put it in \\boxed{}.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert prompt.answer == "5"
    assert prompt.token_ids == chatml(prompt.text, add_special_tokens=False)["input_ids"]


def test_message_list_column_goes_to_the_chat_template_as_it_is(chatml, tmp_path):
    few_shot = [
        {"role": "user", "content": "1 + 1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2 + 2?"},
    ]
    own_system = [{"role": "system", "content": "Own."}, {"role": "user", "content": "3 + 3?"}]
    rows = [{"messages": few_shot, "gold": "4"}, {"messages": own_system, "gold": "6"}]
    cfg = DataConfig(
        source=_write_jsonl(tmp_path / "m.jsonl", rows),
        messages_column="messages",
        answer_column="gold",
        system_prompt="Answer with a number.",
        heldout_fraction=0.0,
    )
    first, second = load_prompts(cfg, chatml).prompts
    assert first.text == (
        "<|im_start|>system\nAnswer with a number.<|im_end|>\n"
        "<|im_start|>user\n1 + 1?<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n"
        "<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    )
    # A row's own system message stays, and the configured one is not added before it.
    assert second.text == (
        "<|im_start|>system\nOwn.<|im_end|>\n<|im_start|>user\n3 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert [first.answer, second.answer] == ["4", "6"]


def test_template_field_naming_a_missing_column_is_a_data_error(chatml, tmp_path):
    path = _write_jsonl(tmp_path / "q.jsonl", [{"question": "Hi?", "answer": "1"}])
    with pytest.raises(DataError) as err:
        load_prompts(DataConfig(source=path, template="{question} in {unit}"), chatml)
    assert str(err.value) == (
        f"data.template field {{unit}} names no column of {path}; columns are "
        "['answer', 'question']"
    )
    cfg = DataConfig(source=path, messages_column="messages")
    with pytest.raises(DataError, match="messages column 'messages' not found"):
        load_prompts(cfg, chatml)


def test_bad_rows_are_skipped_and_counted_in_the_summary(chatml, tmp_path):
    good = {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}
    rows = [
        good,
        {"question": "", "answer": "#### 3"},  # empty prompt
        {"question": "   ", "answer": "#### 3"},  # blank prompt
        {"answer": "#### 4"},  # no prompt value at all
        {"question": "What is 5 + 5?", "answer": "ten"},  # no #### answer
        {"question": "What is 6 + 6?", "answer": None},  # no answer value
        {"question": "What is 7 + 7? " + "Think hard. " * 60, "answer": "#### 14"},  # too long
    ]
    cfg = DataConfig(
        source=_write_jsonl(tmp_path / "bad.jsonl", rows),
        prompt_column="question",
        answer_extractor="gsm8k",
        max_prompt_tokens=120,
        heldout_fraction=0.0,
    )
    data = load_prompts(cfg, chatml)
    assert [(p.index, p.answer) for p in data.prompts] == [(0, "2")]
    assert (data.num_rows, data.num_skipped_empty, data.num_skipped_no_answer) == (7, 3, 2)
    assert data.num_skipped_too_long == 1
    assert "skipped 1 of 7 longer than 120 tokens, 3 with an empty prompt, 2 without an answer" in (
        data.summary()
    )


def test_rows_whose_template_field_is_blank_or_missing_are_skipped_and_counted(chatml, tmp_path):
    # As a blank prompt_column row: an unfilled "Solve: ... ()" is no prompt to train on.
    rows = [
        {"question": "What is 1 + 1?", "unit": "apples", "answer": "#### 2"},
        {"question": "What is 2 + 2?", "unit": "", "answer": "#### 4"},  # empty field
        {"question": "What is 3 + 3?", "unit": " \t", "answer": "#### 6"},  # blank field
        {"question": "What is 4 + 4?", "answer": "#### 8"},  # no value for the field
        {"question": "What is 5 + 5?", "unit": None, "answer": "#### 10"},  # null
        {"question": "", "unit": "pears", "answer": "#### 0"},  # the other field empty
        {"question": "What is 6 + 6?", "unit": "pears", "answer": "#### 12"},
    ]
    cfg = DataConfig(
        source=_write_jsonl(tmp_path / "template.jsonl", rows),
        template="Solve: {question} ({unit})",
        answer_extractor="gsm8k",
        chat_template=False,
        heldout_fraction=0.0,
    )
    data = load_prompts(cfg, chatml)
    assert [(p.index, p.text, p.answer) for p in data.prompts] == [
        (0, "Solve: What is 1 + 1? (apples)", "2"),
        (6, "Solve: What is 6 + 6? (pears)", "12"),
    ]
    assert (data.num_rows, data.num_skipped_empty, data.num_skipped_no_answer) == (7, 5, 0)
    assert "5 with an empty prompt" in data.summary()


def test_a_file_of_bad_rows_is_refused_in_one_line(chatml, tmp_path):
    rows = [{"question": "What is 1 + 1?", "answer": "2"}, {"question": "", "answer": "#### 3"}]
    cfg = DataConfig(
        source=_write_jsonl(tmp_path / "plain.jsonl", rows),
        prompt_column="question",
        answer_extractor="gsm8k",  # the answers have no ####
        heldout_fraction=0.0,
    )
    with pytest.raises(DataError) as err:
        load_prompts(cfg, chatml)
    assert str(err.value) == (
        f"every row of {cfg.source} (train) is bad, none to train on: 1 of 2 with an empty "
        "prompt (data.prompt_column=question), 1 without an answer (data.answer_column=answer, "
        "data.answer_extractor=gsm8k), 0 longer than 4096 tokens"
    )


@pytest.fixture
def _fresh_logging():
    """main() calls logging.basicConfig and datasets adds handlers: bind them to this test's
    captured stderr, and restore the root handlers afterwards."""
    handlers = logging.root.handlers[:]
    logging.root.handlers.clear()
    for logger in [logging.getLogger(n) for n in list(logging.Logger.manager.loggerDict)]:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "closed", 0):
                handler.stream = sys.stderr
    yield
    logging.root.handlers[:] = handlers


@pytest.mark.parametrize(
    "rows, overrides, expected",
    [
        (
            [{"question": "Hi?", "answer": "#### 1"}] * 4,
            ['data.template="Solve: {problem}"'],  # quoted for Hydra, as the guide writes it
            "error: data.template field {{problem}} names no column of {path}; columns are "
            "['answer', 'question']",
        ),
        (
            [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)],
            ["data.prompt_column=question", "data.answer_extractor=boxed"],
            "error: every row of {path} (train: the rest after 10% of rows by prompt hash held "
            "out) is bad, none to train on: 0 of 7 with an empty prompt",
        ),
    ],
    ids=["missing-template-column", "every-row-bad"],
)
def test_train_stops_at_start_up_in_one_line_with_exit_2(
    _fresh_logging, capsys, tmp_path, rows, overrides, expected
):
    path = _write_jsonl(tmp_path / "d.jsonl", rows)
    argv = ["preset=tiny", f"run_dir={tmp_path / 'run'}", "data=jsonl", f"data.source={path}"]
    assert main([*argv, *overrides]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith("sparrow-train:")]
    assert "Traceback" not in err and len(lines) == 1 and err.rstrip().endswith(lines[0]), err
    assert lines[0].startswith(f"sparrow-train: {expected.format(path=path)}"), lines[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_shipped_gsm8k_sample_loads_every_row_with_its_number(chatml):
    cfg = DataConfig(
        source=str(GSM8K_MINI),
        prompt_column="question",
        answer_column="answer",
        answer_extractor="gsm8k",
        heldout_fraction=0.0,
    )
    data = load_prompts(cfg, chatml)
    rows = [json.loads(line) for line in GSM8K_MINI.read_text().splitlines()]
    assert len(data) == len(rows) == 16
    assert data.num_skipped_empty == data.num_skipped_no_answer == data.num_skipped_too_long == 0
    for prompt, row in zip(data.prompts, rows, strict=True):
        assert prompt.answer.isdigit() and row["answer"].endswith(f"\n#### {prompt.answer}")
        assert f"<|im_start|>user\n{row['question']}<|im_end|>" in prompt.text
