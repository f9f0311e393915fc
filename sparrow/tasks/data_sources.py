"""Where prompt rows come from: the embedded task generator ("tasks"), a local jsonl/json/parquet/
csv file or data directory, or a hub dataset name (`datasets.load_dataset`; needs a reachable
hub). Each gives a list of row dicts and its column names; a file that cannot be read raises
`DataError` in sparrow's words, naming it and where there is one the line, row and byte: text
that is not UTF-8 (UTF-16 said as such), a file of blank lines, a line that is not JSON. A local
file is read with `datasets`' progress bars and log lines off, so that the one line is all that
is printed.
"""

import json
import logging
import os
from contextlib import contextmanager

from sparrow.tasks.data_errors import DataError
from sparrow.tasks.generators import generate_tasks

_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def is_local(source: str | None) -> bool:
    if source is None or source == "tasks":
        return False
    return os.path.splitext(source)[1].lower() in _FILE_BUILDERS or os.path.exists(source)


def load_rows(cfg) -> tuple[list[dict], set[str], str]:
    """(rows, column names, source description) of `cfg.source` (a DataConfig's), split
    `cfg.split`."""
    if cfg.source == "tasks":
        try:
            rows = generate_tasks(cfg.tasks, cfg.split)
        except ValueError as e:
            raise DataError(f"embedded tasks: {e}") from e
        columns = set(rows[0]) if rows else {"prompt", "answer"}
        return rows, columns, f"tasks:{cfg.tasks.kind}"

    import datasets  # deferred: a heavy import only file and hub sources need

    extension = os.path.splitext(cfg.source)[1].lower()
    if is_local(cfg.source) and not os.path.exists(cfg.source):
        raise DataError(f"data file not found: {cfg.source}")
    if os.path.isfile(cfg.source) and os.path.getsize(cfg.source) == 0:
        raise DataError(f"dataset {cfg.source} (split {cfg.split!r}) is empty")
    try:
        if extension in _FILE_BUILDERS:
            builder = _FILE_BUILDERS[extension]
            # A single data file is exposed as split "train"; route the requested split to it.
            with _quiet(datasets):
                table = datasets.load_dataset(
                    builder, data_files={cfg.split: cfg.source}, split=cfg.split
                )
        else:
            # A data directory or a hub name (`subset` picks the hub configuration).
            table = datasets.load_dataset(cfg.source, cfg.subset, split=cfg.split)
    except Exception as e:
        # datasets wraps parse errors: the innermost one says what is wrong, and where
        root: BaseException = e
        while (inner := root.__cause__ or root.__context__) is not None:
            root = inner
        if isinstance(root, UnicodeDecodeError) or "invalid utf8" in str(root).lower():
            raise _not_utf8(cfg.source, root) from e
        if os.path.isfile(cfg.source):
            problem = _file_problem(cfg.source, cfg.split, extension)
            if problem is not None:
                raise problem from e
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


@contextmanager
def _quiet(datasets):
    """`datasets` without progress bars or log lines (its reader logs a parse error before
    raising it), restored afterwards."""
    library = datasets.utils.logging
    bars_were_off, verbosity = datasets.are_progress_bars_disabled(), library.get_verbosity()
    datasets.disable_progress_bars()
    library.set_verbosity(logging.CRITICAL)
    try:
        yield
    finally:
        library.set_verbosity(verbosity)
        if not bars_were_off:
            datasets.enable_progress_bars()


def _file_problem(source: str, split: str, extension: str) -> DataError | None:
    """What is wrong with a local file `datasets` could not read, in sparrow's words: no row but
    blank lines, or the first line (JSONL) or place (JSON) that is not JSON; None otherwise."""
    with open(source, "rb") as f:
        lines = f.read().split(b"\n")
    if not any(line.strip() for line in lines):
        return DataError(f"dataset {source} (split {split!r}) is empty: it holds only blank lines")
    documents: list[tuple[int | None, bytes]]
    if extension == ".json":
        documents = [(None, b"\n".join(lines))]
    elif extension == ".jsonl":
        documents = list(enumerate(lines, 1))
    else:
        return None
    row = 0
    for number, line in documents:
        if not line.strip():
            continue  # a blank line is no row
        where = "" if number is None else f" line {number} (row {row})"
        if b"\x00" in line:  # what UTF-16 text without a byte-order mark looks like
            return DataError(
                f"{source}{where} holds NUL bytes: is it UTF-16 text? save the file as UTF-8"
            )
        try:
            json.loads(line.decode("utf-8"))
        except ValueError as err:
            if number is None:  # the whole file is one document: json says where
                return DataError(f"{source} is not JSON ({_reason(err)}): fix it")
            return DataError(
                f"{source}{where} is not JSON ({_reason(err)}): fix or remove that line"
            )
        row += 1
    return None


def _reason(err: ValueError) -> str:
    """json's complaint and where (a JSONL line's column, a document's line and column)."""
    if not isinstance(err, json.JSONDecodeError):
        return str(err)
    where = f"column {err.colno}" if err.lineno == 1 else f"line {err.lineno} column {err.colno}"
    return f"{err.msg}: {where}"


def _not_utf8(source: str, err: BaseException) -> DataError:
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
    if os.path.isfile(source):
        with open(source, "rb") as f:
            if f.read(2) in _UTF16_BOMS:  # Windows tools save "Unicode" text so
                reason = "it starts with a UTF-16 byte-order mark: UTF-16 text"
    return DataError(f"{source}{where} is not UTF-8 text ({reason}): save the file as UTF-8")
