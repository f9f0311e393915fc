"""One dataset row -> the chat messages of its prompt, and the check that the columns it reads
exist. The prompt comes from one of three places, chosen by the data config:

- `data.messages_column`: a list of `{"role": ..., "content": ...}` messages, handed to the chat
  template as they are (a few-shot conversation, a system message of the row's own);
- `data.template`: a string whose `{column}` fields are filled from the row ("Solve: {question}");
  `{{` and `}}` write a literal brace, and any other brace is kept as written, so
  "... within \\boxed{}." needs no escaping;
- `data.prompt_column`: the cell itself, a string (or a list of messages, as above).

`data.system_prompt` goes first as a system message unless the messages begin with one. An empty
prompt (no value, a blank string, no messages, a template field without a value) is None here:
the loader skips the row and counts it.
"""

import re
from typing import Any

from sparrow.tasks.data_errors import DataError

# `{{`, `}}`, or a field `{name}` naming a column; any other brace is literal text.
_TEMPLATE_TOKEN = re.compile(r"\{\{|\}\}|\{([A-Za-z_]\w*)\}")


def template_fields(template: str) -> list[str]:
    """The columns a template's `{column}` fields name, in order of first use."""
    fields = [m.group(1) for m in _TEMPLATE_TOKEN.finditer(template) if m.group(1)]
    return list(dict.fromkeys(fields))


def fill_template(template: str, row: dict[str, Any]) -> str | None:
    """`template` with each field replaced by the row's value; None when a field has no value
    (an unfilled "Solve: " is an empty prompt, not one to train on)."""
    values = {name: row[name] for name in template_fields(template)}
    if any(v is None or not str(v).strip() for v in values.values()):
        return None

    def replace(match: re.Match) -> str:
        return match.group(0)[0] if match.group(1) is None else str(values[match.group(1)])

    return _TEMPLATE_TOKEN.sub(replace, template)


def check_columns(cfg, columns: set[str], source: str) -> None:
    """Raise DataError naming the first column the config reads that `source` lacks."""
    known = f"columns are {sorted(columns)}"
    if cfg.messages_column is not None:
        prompt_columns = [("messages column", cfg.messages_column)]
    elif cfg.template is not None:
        for field in template_fields(cfg.template):
            if field not in columns:
                raise DataError(
                    f"data.template field {{{field}}} names no column of {source}; {known}"
                )
        prompt_columns = []
    else:
        prompt_columns = [("prompt column", cfg.prompt_column)]
    for role, column in [*prompt_columns, ("answer column", cfg.answer_column)]:
        if column not in columns:
            raise DataError(f"{role} {column!r} not found in {source}; {known}")


def prompt_cell(cfg, row: dict[str, Any]) -> str | list | None:
    """What the row says to the model before chat templating: a string or a message list,
    None when that is empty."""
    if cfg.messages_column is None and cfg.template is not None:
        return fill_template(cfg.template, row)
    cell = row[cfg.messages_column or cfg.prompt_column]
    blank = isinstance(cell, str) and not cell.strip()
    return None if cell is None or blank or cell == [] else cell


def chat_messages(cfg, cell: str | list, index: int, source: str) -> list[dict[str, Any]]:
    """The messages of a non-empty prompt cell, the system prompt first when one is set."""
    if isinstance(cell, str) and cfg.messages_column is None:
        messages = [{"role": "user", "content": cell}]
    elif isinstance(cell, list) and all(_is_message(m) for m in cell):
        messages = list(cell)
    else:
        if cfg.messages_column:
            column, expected = f"messages column {cfg.messages_column!r}", "a list of"
        else:
            column = f"prompt column {cfg.prompt_column!r}"
            expected = "a non-empty string or a list of"
        raise DataError(
            f"row {index} of {source}: {column} must hold {expected} chat messages "
            f'({{"role": ..., "content": "..."}}), got {_describe(cell)}'
        )
    if cfg.system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": cfg.system_prompt}, *messages]
    return messages


def render(cfg, tokenizer, messages: list[dict[str, Any]]) -> str:
    """The model-facing text: the chat template's, or the contents joined as plain text."""
    if cfg.chat_template:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "\n\n".join(m["content"] for m in messages)


def _is_message(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and isinstance(message.get("role"), str)
        and isinstance(message.get("content"), str)
    )


def _describe(cell: Any) -> str:
    if isinstance(cell, list):
        bad = next(m for m in cell if not _is_message(m))
        return f"an element {str(bad)[:80]}"
    return type(cell).__name__
