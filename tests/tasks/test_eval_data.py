"""Held-out accuracy is never measured on the training prompts.

A single local file without `data.eval_source` is split once, by a hash of each prompt: the
held-out share (data.heldout_fraction) is evaluated and never trained on, the same rows in any
row order; `data.eval_source` gives evaluation its own file. The plan line says which.
"""

import json
import random

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from sparrow.tasks.data import DataConfig, DataError, load_eval_prompts, load_prompts


@pytest.fixture(scope="module")
def tokenizer():
    backend = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


ROWS = [{"prompt": f"what is {i} + {i}?", "answer": str(2 * i)} for i in range(200)]


def _texts(data) -> set[str]:
    return {p.text for p in data.prompts}


def test_one_file_is_split_into_disjoint_train_and_heldout_parts(tokenizer, tmp_path):
    cfg = DataConfig(source=_write(tmp_path / "all.jsonl", ROWS), chat_template=False)
    train = load_prompts(cfg, tokenizer, heldout=False)
    held = load_eval_prompts(cfg, "heldout", tokenizer)
    assert _texts(train).isdisjoint(_texts(held))
    assert len(train) + len(held) == len(ROWS)
    assert len(held) == 20  # 10% of 200
    assert "held out: 10% of rows by prompt hash" in held.summary()
    assert "train: the rest after 10% of rows by prompt hash held out" in train.summary()
    # The split follows the prompts, not their positions.
    shuffled = random.Random(0).sample(ROWS, len(ROWS))
    moved = DataConfig(source=_write(tmp_path / "moved.jsonl", shuffled), chat_template=False)
    assert _texts(load_eval_prompts(moved, "heldout", tokenizer)) == _texts(held)
    # Prompt indices stay the rows of the source file.
    assert all(ROWS[p.index]["answer"] == p.answer for p in train.prompts + held.prompts)


def test_eval_source_is_its_own_file(tokenizer, tmp_path):
    eval_rows = [{"prompt": f"what is {i} * 3?", "answer": str(3 * i)} for i in range(7)]
    cfg = DataConfig(
        source=_write(tmp_path / "train.jsonl", ROWS),
        eval_source=_write(tmp_path / "eval.jsonl", eval_rows),
        chat_template=False,
    )
    # all of the training file trains
    assert len(load_prompts(cfg, tokenizer, heldout=False)) == len(ROWS)
    held = load_eval_prompts(cfg, "heldout", tokenizer)
    assert [p.answer for p in held.prompts] == [r["answer"] for r in eval_rows]


def test_no_heldout_share_and_no_eval_file_is_refused(tokenizer, tmp_path):
    cfg = DataConfig(
        source=_write(tmp_path / "all.jsonl", ROWS), chat_template=False, heldout_fraction=0.0
    )
    assert len(load_prompts(cfg, tokenizer, heldout=False)) == len(ROWS)
    with pytest.raises(DataError, match="set data.eval_source=FILE or data.heldout_fraction"):
        load_eval_prompts(cfg, "heldout", tokenizer)
