"""Where prompt rows come from: the embedded task generator ("tasks"), a local jsonl/json/parquet/
csv file or data directory, or a hub dataset name (`datasets.load_dataset`; needs a reachable
hub). Each gives a list of row dicts and its column names; a file that cannot be read raises
`DataError` naming it (and, for text that is not UTF-8, the line and byte).
"""

import os

from sparrow.tasks.data_errors import DataError
from sparrow.tasks.generators import generate_tasks

_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


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
    return DataError(f"{source}{where} is not UTF-8 text ({reason}): save the file as UTF-8")
