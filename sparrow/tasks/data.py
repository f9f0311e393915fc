"""Prompt datasets: loading, column mapping, chat templating, and the resumable batch iterator.

A source is the embedded task generator ("tasks", see generators.py), a local jsonl/json/parquet/csv
file or data directory, or a hub dataset name (data_sources.py). Every row becomes a `Prompt`: its
prompt (a column, a template filled from columns, or a message list; prompt_rows.py) is rendered
with the tokenizer's chat template and tokenized once, and its reference answer is taken from the
answer column by `data.answer_extractor` (answer_extractors.py). Bad rows (an empty prompt, no
answer, a prompt over `max_prompt_tokens` or the context) are skipped and counted in `summary()`;
bad input (missing file or column, empty dataset, no chat template, every row bad) raises
`DataError` with a one-line message naming the culprit.

`PromptIterator` yields fixed-size batches forever, reshuffling each epoch from (seed, epoch), so
its whole state is (epoch, position): `state_dict()` goes into a checkpoint and
`load_state_dict()` resumes with exactly the batches an uninterrupted run would have seen.
"""

import hashlib
import json
import os
import random
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from sparrow.tasks.answer_extractors import check_extractor, extract_answer
from sparrow.tasks.data_errors import DataError
from sparrow.tasks.data_sources import is_local, load_rows
from sparrow.tasks.generators import TaskConfig
from sparrow.tasks.prompt_rows import (
    chat_messages,
    check_columns,
    prompt_cell,
    render,
    template_fields,
)


class PromptsTooLong(DataError):
    """Every prompt is over the limit; `shortest_tokens` says what the limit would have to be."""

    def __init__(self, message: str, shortest_tokens: int):
        super().__init__(message)
        self.shortest_tokens = shortest_tokens


@dataclass
class DataConfig:
    source: str | None = "tasks"  # "tasks" (generator), a local file or directory, a hub name
    split: str = "train"  # dataset split; for "tasks": "train" or "heldout"
    subset: str | None = None  # hub dataset configuration name (e.g. "main" for gsm8k)
    prompt_column: str = "prompt"  # column with the user message (string or chat messages)
    answer_column: str = "answer"  # column with the reference answer handed to the reward
    # How the answer cell becomes the reference: "none" (as it is), "gsm8k" (after the last
    # "####"), "boxed" (the last \boxed{...}, nested braces included).
    answer_extractor: str = "none"
    # The user message built from columns instead of prompt_column, e.g. "Solve: {question}".
    template: str | None = None
    # A column of chat messages ([{"role", "content"}]) fed to the chat template as they are,
    # instead of prompt_column or template.
    messages_column: str | None = None
    system_prompt: str | None = None  # prepended as a system message when set
    chat_template: bool = True  # render with the tokenizer's chat template; False: plain text
    max_prompt_tokens: int = 4096  # longer prompts are skipped and counted
    shuffle: bool = True  # reshuffle the prompts every epoch; False keeps the source order
    shuffle_seed: int | None = None  # seeds the shuffle; None: derived from the run's `seed`
    # Evaluation data: a file (or hub name) of its own, same columns. None: the task generator's
    # held-out split, a hub dataset's rl.eval.split, or for a local file a held-out share of it.
    eval_source: str | None = None
    # A local source without eval_source: this share of its rows (chosen by a hash of the prompt,
    # so stable across runs and row order) is held out for evaluation and never trained on.
    heldout_fraction: float = 0.1
    tasks: TaskConfig = field(default_factory=TaskConfig)  # generator settings for "tasks"

    def __post_init__(self):
        if not 0 <= self.heldout_fraction < 1:
            raise ValueError(
                f"data.heldout_fraction must be in [0, 1), got {self.heldout_fraction}"
            )
        check_extractor(self.answer_extractor)
        if self.template is not None and self.messages_column is not None:
            raise ValueError("set data.template or data.messages_column, not both")
        if self.template is not None and not template_fields(self.template):
            raise ValueError(
                f"data.template {self.template!r} has no {{column}} field: every prompt would be "
                "the same; name a column, e.g. 'Solve: {question}'"
            )


@dataclass(frozen=True)
class Prompt:
    index: int  # row of the source dataset, a stable id for logs
    text: str  # what the model sees (chat-templated unless chat_template is off)
    token_ids: list[int]  # `text` tokenized, at most max_prompt_tokens long
    answer: str  # reference answer for the reward
    metadata: dict[str, Any]  # generator's id, task and metadata; {} for external datasets
    # What a multi-turn environment is built from (tasks/environment.py): the source row's
    # columns, its user message under "prompt" and the reference under "answer".
    row: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass
class PromptDataset:
    prompts: list[Prompt]
    source: str  # human-readable origin, e.g. "tasks:arithmetic" or a file path
    split: str
    num_rows: int  # rows in the source (this split of it) before any was skipped
    num_skipped_too_long: int  # rows dropped for exceeding max_prompt_tokens
    max_prompt_tokens: int  # the limit applied: data.max_prompt_tokens or the context room
    num_skipped_empty: int = 0  # rows dropped for an empty prompt
    num_skipped_no_answer: int = 0  # rows dropped for no answer (by data.answer_extractor)

    def __len__(self) -> int:
        return len(self.prompts)

    def prompt_lengths(self) -> tuple[int, int]:
        """(longest prompt, token prefix common to all prompts), for sizing the actor's passes."""
        ids = [p.token_ids for p in self.prompts]
        # commonprefix compares any sequences element-wise (only the min and max list).
        return max(map(len, ids), default=0), len(os.path.commonprefix(ids))

    def summary(self) -> str:
        """One line for the run log: counts, skips and the prompt-length distribution."""
        lengths = sorted(len(p.token_ids) for p in self.prompts)
        return (
            f"{len(self.prompts)} prompts from {self.source} ({self.split}); skipped "
            f"{self.num_skipped_too_long} of {self.num_rows} longer than {self.max_prompt_tokens} "
            f"tokens, {self.num_skipped_empty} with an empty prompt, "
            f"{self.num_skipped_no_answer} without an answer; prompt tokens min {lengths[0]} "
            f"median {statistics.median(lengths):.0f} max {lengths[-1]}"
        )


def load_eval_prompts(
    cfg: DataConfig, eval_split: str, tokenizer, context_tokens: int | None = None
) -> PromptDataset:
    """The evaluation prompts, never the training ones: `cfg.eval_source` when set; else the
    generator's or hub dataset's `eval_split`; else the held-out share of a local file."""
    if cfg.eval_source is not None:
        own = replace(cfg, source=cfg.eval_source, eval_source=None, heldout_fraction=0.0)
        return load_prompts(own, tokenizer, context_tokens)
    if not is_local(cfg.source):
        return load_prompts(replace(cfg, split=eval_split), tokenizer, context_tokens)
    if cfg.heldout_fraction == 0:
        raise DataError(
            f"no evaluation data for {cfg.source}: set data.eval_source=FILE or "
            "data.heldout_fraction > 0"
        )
    return load_prompts(cfg, tokenizer, context_tokens, heldout=True)


def load_prompts(
    cfg: DataConfig, tokenizer, context_tokens: int | None = None, heldout: bool | None = None
) -> PromptDataset:
    """Load `cfg.source`, build each row's prompt and answer, template and tokenize, and skip
    (and count) the rows with an empty prompt, no answer or too long a prompt.

    `context_tokens`: what a prompt may use of the model's and the engine's context window (the
    window minus the completion cap); prompts over min(cfg.max_prompt_tokens, context_tokens)
    are skipped and counted, so that one long row cannot end a run inside the engine.
    `heldout`: None loads every row; for a local file without `eval_source`, True picks the
    held-out share (`heldout_fraction`, for evaluation) and False the rest (for training).
    """
    if cfg.source is None:
        raise DataError("data.source is not set: give a file, e.g. data.source=train.jsonl")
    limit = cfg.max_prompt_tokens
    if context_tokens is not None:
        limit = min(limit, context_tokens)
    rows, columns, source = load_rows(cfg)
    if len(rows) == 0:
        raise DataError(f"dataset {source} (split {cfg.split!r}) is empty")
    check_columns(cfg, columns, source)
    cells = [prompt_cell(cfg, row) for row in rows]
    row_ids, split = _split_rows(cfg, cells, source, heldout)
    if cfg.chat_template and getattr(tokenizer, "chat_template", None) is None:
        raise DataError(
            "the tokenizer has no chat template; set data.chat_template=false to feed prompts "
            "as plain text"
        )
    usable, num_empty, num_no_answer = [], 0, 0
    for i in row_ids:
        cell = cells[i]
        answer = extract_answer(cfg.answer_extractor, rows[i][cfg.answer_column])
        num_empty += cell is None
        num_no_answer += cell is not None and answer is None
        if cell is not None and answer is not None:
            messages = chat_messages(cfg, cell, i, source)
            text = render(cfg, tokenizer, messages)
            users = [m["content"] for m in messages if m["role"] == "user"]
            row = {**rows[i], "prompt": users[-1] if users else text, "answer": answer}
            usable.append((i, text, answer, row))
    # Chat templates write their own special tokens (BOS included); plain text gets the
    # tokenizer's defaults.
    texts = [text for _, text, _, _ in usable]
    token_ids = (
        tokenizer(texts, add_special_tokens=not cfg.chat_template)["input_ids"] if texts else []
    )
    prompts = [
        Prompt(i, text, list(ids), answer, _metadata(cfg, rows[i]), row)
        for (i, text, answer, row), ids in zip(usable, token_ids, strict=True)
        if len(ids) <= limit
    ]
    data = PromptDataset(prompts, source, split, len(row_ids), len(usable) - len(prompts), limit,
                         num_empty, num_no_answer)  # fmt: skip
    if not prompts:
        raise _every_row_bad(cfg, data, context_tokens, token_ids)
    return data


def _split_rows(
    cfg: DataConfig, cells: list, source: str, heldout: bool | None
) -> tuple[list[int], str]:
    """(the rows to load, the split's description): all of them, or for a local file without
    eval_source the held-out share (heldout=True) or the rest (heldout=False)."""
    row_ids = list(range(len(cells)))
    split_off = cfg.eval_source is None and cfg.heldout_fraction > 0 and is_local(cfg.source)
    if heldout is None or not split_off:
        return row_ids, cfg.split
    # The share of rows with the lowest prompt hashes: independent of row order, and at least
    # one row held out (and one kept) for any file of two rows or more.
    ranked = sorted(row_ids, key=lambda i: _prompt_hash(cells[i]))
    count = min(max(1, round(cfg.heldout_fraction * len(cells))), len(cells) - 1)
    held = set(ranked[:count])
    row_ids = [i for i in row_ids if (i in held) == heldout]
    share = f"{cfg.heldout_fraction:.0%} of rows by prompt hash"  # at least one row
    if not row_ids:
        raise DataError(
            f"{source}: no {'held-out' if heldout else 'training'} rows left by "
            f"data.heldout_fraction={cfg.heldout_fraction}; set data.eval_source=FILE"
        )
    return row_ids, f"held out: {share}" if heldout else f"train: the rest after {share} held out"


def _every_row_bad(
    cfg: DataConfig, data: PromptDataset, context_tokens: int | None, token_ids: list[list[int]]
) -> DataError:
    """The one-line refusal of a dataset none of whose rows can be trained on."""
    limit = data.max_prompt_tokens
    if data.num_skipped_too_long == data.num_rows:
        why = f"data.max_prompt_tokens={cfg.max_prompt_tokens}"
        if context_tokens is not None:
            why += f"; {context_tokens} tokens left by the context window"
        return PromptsTooLong(
            f"all {data.num_rows} prompts of {data.source} are longer than {limit} tokens ({why})",
            min(map(len, token_ids)),
        )
    prompt_from = (
        f"data.messages_column={cfg.messages_column}" if cfg.messages_column
        else f"data.template={cfg.template!r}" if cfg.template
        else f"data.prompt_column={cfg.prompt_column}"
    )  # fmt: skip
    return DataError(
        f"every row of {data.source} ({data.split}) is bad, none to train on: "
        f"{data.num_skipped_empty} of {data.num_rows} with an empty prompt ({prompt_from}), "
        f"{data.num_skipped_no_answer} without an answer (data.answer_column="
        f"{cfg.answer_column}, data.answer_extractor={cfg.answer_extractor}), "
        f"{data.num_skipped_too_long} longer than {limit} tokens"
    )


def _metadata(cfg: DataConfig, row: dict[str, Any]) -> dict[str, Any]:
    if cfg.source != "tasks":
        return {}
    return {"id": row["id"], "task": row["task"], **row["metadata"]}


def _prompt_hash(prompt: Any) -> bytes:
    """A row's place in the held-out ranking: a hash of its prompt, not its position."""
    return hashlib.sha256(json.dumps(prompt, sort_keys=True).encode()).digest()


class PromptIterator:
    """Endless fixed-size batches of prompts; resumable from (epoch, position).

    Each epoch visits every prompt once in an order drawn from (shuffle_seed, epoch). A tail
    shorter than `batch_size` is dropped so that every step sees the same number of prompts
    (it is a different tail each epoch when shuffling).
    """

    def __init__(self, dataset: PromptDataset, batch_size: int, shuffle_seed: int | None = 0):
        if not 1 <= batch_size <= len(dataset):
            raise DataError(
                f"batch size {batch_size} must be between 1 and the {len(dataset)} prompts of "
                f"{dataset.source}"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle_seed = shuffle_seed
        self.epoch = 0
        self.position = 0  # prompts of the current epoch already handed out
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.dataset)))
        if self.shuffle_seed is not None:
            random.Random(f"{self.shuffle_seed}-{epoch}").shuffle(order)
        return order

    def __iter__(self) -> "PromptIterator":
        return self

    def __next__(self) -> list[Prompt]:
        if self.position + self.batch_size > len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._epoch_order(self.epoch)
        picked = self._order[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return [self.dataset.prompts[i] for i in picked]

    def state_dict(self) -> dict[str, int | None]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "batch_size": self.batch_size,
            "shuffle_seed": self.shuffle_seed,
            "num_prompts": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, int | None]) -> None:
        # Resuming onto a different dataset or order would silently repeat or skip prompts.
        expected = {
            "batch_size": self.batch_size,
            "shuffle_seed": self.shuffle_seed,
            "num_prompts": len(self.dataset),
        }
        for key, value in expected.items():
            if state[key] != value:
                raise DataError(
                    f"cannot resume the prompt iterator: checkpoint has {key}={state[key]}, "
                    f"this run has {value}"
                )
        epoch, position = state["epoch"], state["position"]
        assert epoch is not None and position is not None, "state_dict writes both"
        self.epoch, self.position = int(epoch), int(position)
        self._order = self._epoch_order(self.epoch)
