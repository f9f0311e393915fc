"""Prompt datasets: sources, column mapping, templating, length filter, errors, resumption."""

import json
import os
import subprocess
import sys

import pytest
from hang_guard import HANG_GUARD_S
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from sparrow.tasks.data import DataConfig, DataError, PromptIterator, load_prompts
from sparrow.tasks.generators import TaskConfig

_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    """Word-level tokenizer: every whitespace-separated word is one token (unknowns -> <unk>)."""
    vocab = {"<unk>": 0, "<|user|>": 1, "<|system|>": 2, "<|assistant|>": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    tok.chat_template = _TEMPLATE
    return tok


def _tasks(**task_fields) -> DataConfig:
    fields = dict(num_examples=16, num_heldout=4) | task_fields
    return DataConfig(source="tasks", tasks=TaskConfig(**fields))


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_tasks_source_is_templated_and_tokenized(tokenizer):
    data = load_prompts(_tasks(), tokenizer)
    assert len(data) == 16 and data.num_skipped_too_long == 0
    prompt = data.prompts[0]
    assert prompt.text.startswith("<|user|> What is ") and prompt.text.endswith("<|assistant|> ")
    assert prompt.token_ids == tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
    assert prompt.token_ids[0] == 1 and prompt.token_ids[-1] == 3
    assert prompt.answer.lstrip("-").isdigit() and "operands" in prompt.metadata
    assert prompt.metadata["task"] == "arithmetic" and prompt.metadata["id"].startswith("arith")
    heldout = load_prompts(DataConfig(split="heldout", tasks=_tasks().tasks), tokenizer)
    assert len(heldout) == 4 and not {p.text for p in heldout.prompts} & {
        p.text for p in data.prompts
    }


def test_system_prompt_is_prepended(tokenizer):
    cfg = _tasks()
    cfg.system_prompt = "Think step by step."
    text = load_prompts(cfg, tokenizer).prompts[0].text
    assert text.startswith("<|system|> Think step by step. <|user|> What is ")


def test_jsonl_with_column_mapping_and_chat_message_prompts(tokenizer, tmp_path):
    rows = [
        {"question": "What is 2 + 2?", "solution": 4},
        {"question": [{"role": "user", "content": "Name the 3rd prime."}], "solution": "5"},
    ]
    cfg = DataConfig(source=_write_jsonl(tmp_path / "d.jsonl", rows), prompt_column="question",
                     answer_column="solution", shuffle_seed=None)  # fmt: skip
    data = load_prompts(cfg, tokenizer)
    assert [p.text for p in data.prompts] == [
        "<|user|> What is 2 + 2? <|assistant|> ",
        "<|user|> Name the 3rd prime. <|assistant|> ",
    ]
    assert [p.answer for p in data.prompts] == ["4", "5"]  # non-string answers become strings
    assert data.source.endswith("d.jsonl") and data.prompts[1].metadata == {}


def test_parquet_and_csv_load_with_column_mapping(tokenizer, tmp_path):
    import datasets

    table = datasets.Dataset.from_list([{"q": "What is 1 + 1?", "a": "2"}, {"q": "Hi?", "a": "x"}])
    table.to_parquet(str(tmp_path / "d.parquet"))
    table.to_csv(str(tmp_path / "d.csv"), index=False)
    for name in ("d.parquet", "d.csv"):
        cfg = DataConfig(source=str(tmp_path / name), prompt_column="q", answer_column="a")
        data = load_prompts(cfg, tokenizer)
        assert [p.answer for p in data.prompts] == ["2", "x"], name


def test_missing_column_error_names_the_column_and_file(tokenizer, tmp_path):
    path = _write_jsonl(tmp_path / "qa.jsonl", [{"question": "Hi?", "answer": "1"}])
    with pytest.raises(
        DataError, match=r"prompt column 'prompt' not found in .*qa\.jsonl.*question"
    ):
        load_prompts(DataConfig(source=path), tokenizer)
    cfg = DataConfig(source=path, prompt_column="question", answer_column="gold")
    with pytest.raises(DataError, match="answer column 'gold' not found"):
        load_prompts(cfg, tokenizer)


def test_empty_dataset_and_missing_file_errors_name_them(tokenizer, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match=r"empty\.jsonl .*is empty"):
        load_prompts(DataConfig(source=str(empty)), tokenizer)
    with pytest.raises(DataError, match=r"not found: .*nope\.parquet"):
        load_prompts(DataConfig(source=str(tmp_path / "nope.parquet")), tokenizer)
    with pytest.raises(DataError, match="is empty"):
        load_prompts(_tasks(num_examples=0), tokenizer)


# Files datasets/Arrow refuse in their own words, logging an error first (issue 61 item 10).
_UNREADABLE = {
    "blank.jsonl": (b"\n\n  \n", "dataset {} (split 'train') is empty: it holds only blank lines"),
    "utf16.jsonl": (
        '{"prompt": "2 + 2?", "answer": "4"}\n'.encode("utf-16"),
        "{} line 1 (row 0), byte 1 (0xff) is not UTF-8 text (it starts with a UTF-16 "
        "byte-order mark: UTF-16 text): save the file as UTF-8",
    ),
    "utf16le.jsonl": (
        '{"prompt": "2 + 2?", "answer": "4"}\n'.encode("utf-16-le"),
        "{} line 1 (row 0) holds NUL bytes: is it UTF-16 text? save the file as UTF-8",
    ),
    "cut.jsonl": (
        b'{"prompt": "2 + 2?", "answer": "4"}\n\n{"prompt": "3 + 3?", "ans',
        "{} line 3 (row 1) is not JSON (Unterminated string starting at: column 22): fix or "
        "remove that line",
    ),
    "cut.json": (
        b'[{"prompt": "2 + 2?",\n  "answer": "4"\n',
        "{} is not JSON (Expecting ',' delimiter: line 3 column 1): fix it",
    ),
}


def test_unreadable_file_is_named_with_line_row_and_reason_and_nothing_else(tmp_path):
    """In a fresh process (datasets' log handler holds the stderr it was first given): each
    file's DataError in sparrow's words, and not a byte on stderr (no progress bar, no log)."""
    for name, (content, _) in _UNREADABLE.items():
        (tmp_path / name).write_bytes(content)
    script = (
        "import sys\n"
        "from sparrow.tasks.data import DataConfig, DataError\n"
        "from sparrow.tasks.data_sources import load_rows\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        load_rows(DataConfig(source=path))\n"
        "    except DataError as err:\n"
        "        print(err)\n"
    )
    paths = [str(tmp_path / name) for name in _UNREADABLE]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-c", script, *paths], env=env, capture_output=True, timeout=HANG_GUARD_S
    )
    assert out.returncode == 0 and out.stderr == b"", out.stderr.decode(errors="replace")
    expected = [
        line.format(path) for path, (_, line) in zip(paths, _UNREADABLE.values(), strict=True)
    ]
    assert out.stdout.decode().splitlines() == expected


def test_blank_prompt_is_skipped_and_a_malformed_message_is_reported_with_its_row(
    tokenizer, tmp_path
):
    rows = [{"prompt": "ok", "answer": "1"}, {"prompt": " ", "answer": "2"}]
    data = load_prompts(DataConfig(source=_write_jsonl(tmp_path / "d.jsonl", rows)), tokenizer)
    assert [p.index for p in data.prompts] == [0] and data.num_skipped_empty == 1
    rows = [
        {"prompt": [{"role": "user", "content": "ok"}], "answer": "1"},
        {"prompt": [{"role": "user"}], "answer": "2"},  # no content
    ]
    with pytest.raises(DataError, match="row 1 .*prompt column 'prompt' must hold"):
        load_prompts(DataConfig(source=_write_jsonl(tmp_path / "m.jsonl", rows)), tokenizer)


def test_no_chat_template_is_an_error_unless_plain_text_is_asked_for(tokenizer):
    plain_tok = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend_tokenizer, unk_token="<unk>"
    )
    assert plain_tok.chat_template is None
    with pytest.raises(DataError, match="chat_template=false"):
        load_prompts(_tasks(), plain_tok)
    cfg = _tasks()
    cfg.chat_template = False
    cfg.system_prompt = "Be brief."
    text = load_prompts(cfg, plain_tok).prompts[0].text
    assert text.startswith("Be brief.\n\nWhat is ") and "<|" not in text


def test_too_long_prompts_are_skipped_and_counted(tokenizer):
    cfg = _tasks(kind="long_context", num_examples=20, context_words=400, context_jitter=0.3)
    lengths = sorted(len(p.token_ids) for p in load_prompts(cfg, tokenizer).prompts)
    cfg.max_prompt_tokens = lengths[len(lengths) // 2]
    data = load_prompts(cfg, tokenizer)
    assert data.num_rows == 20 and data.num_skipped_too_long == 20 - len(data)
    assert 0 < data.num_skipped_too_long < 20
    assert all(len(p.token_ids) <= cfg.max_prompt_tokens for p in data.prompts)
    assert f"skipped {data.num_skipped_too_long} of 20" in data.summary()
    cfg.max_prompt_tokens = 10
    with pytest.raises(DataError, match="max_prompt_tokens=10"):
        load_prompts(cfg, tokenizer)


def test_unreachable_hub_dataset_raises_a_data_error_naming_it(tokenizer, monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    # The real call would try the network; the point here is how a failure is reported.
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match="'someone/some-dataset'"):
        load_prompts(DataConfig(source="someone/some-dataset"), tokenizer)


def _indices(batch):
    return [p.index for p in batch]


def test_iterator_covers_each_epoch_once_and_reshuffles(tokenizer):
    data = load_prompts(_tasks(), tokenizer)  # 16 prompts
    it = PromptIterator(data, batch_size=5, shuffle_seed=0)
    epoch0 = [i for _ in range(3) for i in _indices(next(it))]  # 15 of 16; the tail is dropped
    assert len(set(epoch0)) == 15 and it.epoch == 0
    epoch1 = _indices(next(it))
    assert it.epoch == 1 and len(epoch1) == 5
    assert epoch0[:5] != epoch1
    ordered = PromptIterator(data, batch_size=4, shuffle_seed=None)
    assert _indices(next(ordered)) == [0, 1, 2, 3]


def test_iterator_resumes_exactly_from_its_state(tokenizer):
    data = load_prompts(_tasks(), tokenizer)
    reference = PromptIterator(data, batch_size=3, shuffle_seed=7)
    expected = [_indices(next(reference)) for _ in range(12)]  # crosses two epoch boundaries
    it = PromptIterator(data, batch_size=3, shuffle_seed=7)
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(it.state_dict()))  # survives a checkpoint round trip
    resumed = PromptIterator(data, batch_size=3, shuffle_seed=7)
    resumed.load_state_dict(state)
    assert [_indices(next(resumed)) for _ in range(5)] == expected[7:]
    with pytest.raises(DataError, match="shuffle_seed"):
        PromptIterator(data, batch_size=3, shuffle_seed=8).load_state_dict(state)
    with pytest.raises(DataError, match="batch size 17"):
        PromptIterator(data, batch_size=17)
