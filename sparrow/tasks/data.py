"""Prompt datasets: loading, column mapping, chat templating, and the resumable batch iterator.

A source is the embedded task generator ("tasks", see generators.py), a local jsonl/json/parquet/csv
file or data directory, or a hub dataset name (loaded with `datasets.load_dataset`; needs a
reachable hub). Every row becomes a `Prompt`: the user message (a string, or a list of chat
messages) is rendered with the tokenizer's chat template and tokenized once, and prompts longer
than `max_prompt_tokens` are skipped and counted. Bad input (missing file or column, empty
dataset, no chat template) raises `DataError` with a message naming the culprit.

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

from sparrow.tasks.generators import TaskConfig, generate_tasks

_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class DataError(ValueError):
    """Unusable prompt data; the message names the file, split or column at fault."""


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


@dataclass(frozen=True)
class Prompt:
    index: int  # row of the source dataset, a stable id for logs
    text: str  # what the model sees (chat-templated unless chat_template is off)
    token_ids: list[int]  # `text` tokenized, at most max_prompt_tokens long
    answer: str  # reference answer for the reward
    metadata: dict[str, Any]  # generator's id, task and metadata; {} for external datasets


@dataclass
class PromptDataset:
    prompts: list[Prompt]
    source: str  # human-readable origin, e.g. "tasks:arithmetic" or a file path
    split: str
    num_rows: int  # rows in the source before length filtering
    num_skipped_too_long: int  # rows dropped for exceeding max_prompt_tokens
    max_prompt_tokens: int  # the limit applied: data.max_prompt_tokens or the context room

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
            f"tokens; prompt tokens min {lengths[0]} median {statistics.median(lengths):.0f} "
            f"max {lengths[-1]}"
        )


def load_eval_prompts(
    cfg: DataConfig, eval_split: str, tokenizer, context_tokens: int | None = None
) -> PromptDataset:
    """The evaluation prompts, never the training ones: `cfg.eval_source` when set; else the
    generator's or hub dataset's `eval_split`; else the held-out share of a local file."""
    if cfg.eval_source is not None:
        own = replace(cfg, source=cfg.eval_source, eval_source=None, heldout_fraction=0.0)
        return load_prompts(own, tokenizer, context_tokens)
    if not _is_local(cfg.source):
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
    """Load `cfg.source`, map its columns, template and tokenize, and drop too-long prompts.

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
    rows, columns, source = _load_rows(cfg)
    if len(rows) == 0:
        raise DataError(f"dataset {source} (split {cfg.split!r}) is empty")
    for role, column in (("prompt", cfg.prompt_column), ("answer", cfg.answer_column)):
        if column not in columns:
            raise DataError(
                f"{role} column {column!r} not found in {source}; columns are {sorted(columns)}"
            )
    split, row_ids = cfg.split, list(range(len(rows)))
    split_off = cfg.eval_source is None and cfg.heldout_fraction > 0 and _is_local(cfg.source)
    if heldout is not None and split_off:
        # The share of rows with the lowest prompt hashes: independent of row order, and at
        # least one row held out (and one kept) for any file of two rows or more.
        ranked = sorted(row_ids, key=lambda i: _prompt_hash(rows[i][cfg.prompt_column]))
        held = set(ranked[: min(max(1, round(cfg.heldout_fraction * len(rows))), len(rows) - 1)])
        row_ids = [i for i in row_ids if (i in held) == heldout]
        rows = [rows[i] for i in row_ids]
        share = f"{cfg.heldout_fraction:.0%} of rows by prompt hash"  # at least one row
        split = f"held out: {share}" if heldout else f"train: the rest after {share} held out"
        if not rows:
            raise DataError(
                f"{source}: no {'held-out' if heldout else 'training'} rows left by "
                f"data.heldout_fraction={cfg.heldout_fraction}; set data.eval_source=FILE"
            )
    if cfg.chat_template and getattr(tokenizer, "chat_template", None) is None:
        raise DataError(
            "the tokenizer has no chat template; set data.chat_template=false to feed prompts "
            "as plain text"
        )

    texts = [
        _render(cfg, tokenizer, row[cfg.prompt_column], i, source)
        for i, row in zip(row_ids, rows, strict=True)
    ]
    # Chat templates write their own special tokens (BOS included); plain text gets the
    # tokenizer's defaults.
    token_ids = tokenizer(texts, add_special_tokens=not cfg.chat_template)["input_ids"]
    prompts = []
    for i, row, text, ids in zip(row_ids, rows, texts, token_ids, strict=True):
        if len(ids) > limit:
            continue
        answer = row[cfg.answer_column]
        if answer is None:
            raise DataError(
                f"row {i} of {source} has no value in answer column {cfg.answer_column!r}"
            )
        metadata = {}
        if cfg.source == "tasks":
            metadata = {"id": row["id"], "task": row["task"], **row["metadata"]}
        prompts.append(Prompt(i, text, list(ids), str(answer), metadata))
    if not prompts:
        why = f"data.max_prompt_tokens={cfg.max_prompt_tokens}"
        if context_tokens is not None:
            why += f"; {context_tokens} tokens left by the context window"
        raise PromptsTooLong(
            f"all {len(rows)} prompts of {source} are longer than {limit} tokens ({why})",
            min(map(len, token_ids)),
        )
    return PromptDataset(prompts, source, split, len(rows), len(rows) - len(prompts), limit)


def _is_local(source: str | None) -> bool:
    if source is None or source == "tasks":
        return False
    return os.path.splitext(source)[1].lower() in _FILE_BUILDERS or os.path.exists(source)


def _prompt_hash(prompt: Any) -> bytes:
    """A row's place in the held-out ranking: a hash of its prompt, not its position."""
    return hashlib.sha256(json.dumps(prompt, sort_keys=True).encode()).digest()


def _load_rows(cfg: DataConfig) -> tuple[list[dict], set[str], str]:
    """(rows, column names, source description) for any kind of source."""
    if cfg.source == "tasks":
        try:
            rows = generate_tasks(cfg.tasks, cfg.split)
        except ValueError as e:
            raise DataError(f"embedded tasks: {e}") from e
        columns = set(rows[0]) if rows else {"prompt", "answer"}
        return rows, columns, f"tasks:{cfg.tasks.kind}"

    import datasets  # deferred: a heavy import only file and hub sources need

    extension = os.path.splitext(cfg.source)[1].lower()
    is_local = extension in _FILE_BUILDERS or os.path.exists(cfg.source)
    if is_local and not os.path.exists(cfg.source):
        raise DataError(f"data file not found: {cfg.source}")
    if os.path.isfile(cfg.source) and os.path.getsize(cfg.source) == 0:
        raise DataError(f"dataset {cfg.source} (split {cfg.split!r}) is empty")
    try:
        if extension in _FILE_BUILDERS:
            builder = _FILE_BUILDERS[extension]
            # A single data file is exposed as split "train"; route the requested split to it.
            table = datasets.load_dataset(
                builder, data_files={cfg.split: cfg.source}, split=cfg.split
            )
        else:
            # A data directory or a hub name (`subset` picks the hub configuration).
            table = datasets.load_dataset(cfg.source, cfg.subset, split=cfg.split)
    except Exception as e:
        root = e  # datasets wraps parse errors: the innermost one says what is wrong, and where
        while (root.__cause__ or root.__context__) is not None:
            root = root.__cause__ or root.__context__
        if isinstance(root, UnicodeDecodeError) or "invalid utf8" in str(root).lower():
            raise _not_utf8(cfg.source, root) from e
        detail = "" if root is e else f" ({type(root).__name__}: {root})"
        raise DataError(
            f"could not load dataset {cfg.source!r} (split {cfg.split!r}): "
            f"{type(e).__name__}: {e}{detail}"
        ) from e
    try:  # pyarrow keeps a JSON string's bytes as they are and decodes them here
        rows = table.to_list()
    except UnicodeDecodeError as e:
        raise _not_utf8(cfg.source, e) from e
    return rows, set(table.column_names), cfg.source


def _not_utf8(source: str, err: Exception) -> DataError:
    """The error for a data file that is not UTF-8, naming the file, line and row."""
    where = ""
    if os.path.isfile(source):
        with open(source, "rb") as f:
            for number, line in enumerate(f, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as bad:
                    byte = line[bad.start : bad.start + 1].hex()
                    # A row per line, after the header line of a CSV.
                    first = {".jsonl": 1, ".csv": 2}.get(os.path.splitext(source)[1].lower())
                    row = None if first is None else number - first
                    where = f" line {number}{'' if row is None else f' (row {row})'}, byte "
                    where += f"{bad.start + 1} (0x{byte})"
                    break
    reason = err.reason if isinstance(err, UnicodeDecodeError) else str(err)
    return DataError(f"{source}{where} is not UTF-8 text ({reason}): save the file as UTF-8")


def _render(cfg: DataConfig, tokenizer, prompt: Any, index: int, source: str) -> str:
    """The model-facing text of one prompt cell: a string or a list of {role, content}."""
    if isinstance(prompt, str) and prompt.strip():
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        messages = list(prompt)
    else:
        raise DataError(
            f"row {index} of {source}: prompt column {cfg.prompt_column!r} must hold a non-empty "
            f"string or a list of chat messages, got {type(prompt).__name__}"
        )
    if cfg.system_prompt and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": cfg.system_prompt}] + messages
    if cfg.chat_template:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "\n\n".join(m["content"] for m in messages)


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
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._epoch_order(self.epoch)
