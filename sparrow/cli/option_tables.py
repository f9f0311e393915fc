"""The option tables of docs/guide/: every field of the run's config dataclasses (SparrowConfig and
the dataclasses it nests), its default and its doc comment, written between marker lines, so that
a guide cannot drift from the config it documents.

    python -m sparrow.cli.option_tables           # rewrite the guides' tables
    python -m sparrow.cli.option_tables --check   # exit 1 if a table is stale or a field is missing

A guide asks for a table with `<!-- options: KEY KEY ... -->` ... `<!-- /options -->`: a KEY that
names a section (`rl.correction`) brings every field under it, one that names a field brings that
field. `<!-- bench-commands -->` ... `<!-- /bench-commands -->` is the table of sparrow-bench's
subcommands (sparrow/bench/cli.py). A field's doc is its comment: the one on its line, and the
comment lines right above it. The check fails on a field without one, on a field no guide's table
lists, and on a marker KEY that names nothing (tests/cli/test_option_tables.py).

Columns: the dataclass default, and what `sparrow-train` composes from conf/config.yaml where that
differs (the CPU default run, `make train`).
"""

import argparse
import ast
import dataclasses
import inspect
import io
import re
import sys
import tokenize
import typing
from dataclasses import dataclass
from pathlib import Path

from sparrow.cli.config_loader import KEYWORD_KEYS, load_config
from sparrow.train.config import SparrowConfig

REPO = Path(__file__).resolve().parents[2]
GUIDES = REPO / "docs" / "guide"
BENCH_CLI = REPO / "sparrow" / "bench" / "cli.py"
OPTIONS = re.compile(r"^<!-- options: (?P<keys>[^>]*?) -->\n.*?^<!-- /options -->$", re.M | re.S)
BENCH_BEGIN, BENCH_END = "<!-- bench-commands -->", "<!-- /bench-commands -->"
BENCH = re.compile(rf"^{BENCH_BEGIN}\n.*?^{BENCH_END}$", re.M | re.S)
_FIELD_KEYS = {field: typed for typed, field in KEYWORD_KEYS.items()}  # rl.async_rollout: rl.async


@dataclass(frozen=True)
class Option:
    key: str  # as a user types it: rl.async.staleness
    path: str  # the dataclass path: rl.async_rollout.staleness
    default: object  # the dataclass default
    doc: str  # the field's comment, joined into one line; "" when it has none
    where: str  # file:line of the field


def user_key(field_key: str) -> str:
    """The key a user types for a field's dotted path (`rl.async_rollout.x` -> `rl.async.x`)."""
    for field, typed in _FIELD_KEYS.items():
        if field_key == field or field_key.startswith(field + "."):
            return typed + field_key[len(field) :]
    return field_key


def field_docs(cls: type) -> dict[str, tuple[str, int]]:
    """field name -> (its comment, its line) for one dataclass: the comment on the field's own
    lines, after the comment lines right above it."""
    lines, first = inspect.getsourcelines(cls)
    source = "".join(lines)
    comments: dict[int, str] = {}  # line (1-based, in the class source) -> comment text
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef)
    docs = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        end = stmt.end_lineno or stmt.lineno
        above: list[str] = []
        line = stmt.lineno - 1
        while line in comments and line not in code_lines:
            above.insert(0, comments[line])
            line -= 1
        own = [comments[n] for n in range(stmt.lineno, end + 1) if n in comments]
        docs[stmt.target.id] = (" ".join(above + own), first + stmt.lineno - 1)
    return docs


def options(root: type = SparrowConfig) -> list[Option]:
    """Every leaf field under `root`, in declaration order, with its default and doc."""
    found: list[Option] = []

    def walk(cls: type, prefix: str, instance: object) -> None:
        hints = typing.get_type_hints(cls)
        docs = field_docs(cls)
        where = _shown_path(Path(inspect.getsourcefile(cls) or "?").resolve())
        for f in dataclasses.fields(cls):
            value = getattr(instance, f.name)
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], f"{prefix}{f.name}.", value)
                continue
            doc, line = docs.get(f.name, ("", 0))
            key = prefix + f.name
            found.append(Option(user_key(key), key, value, doc, f"{where}:{line}"))

    walk(root, "", root())
    return found


def composed_defaults(opts: list[Option]) -> dict[str, object]:
    """key -> the value `sparrow-train` with no override composes (conf/config.yaml)."""
    cfg = load_config([])
    out = {}
    for opt in opts:
        value: object = cfg
        for part in opt.path.split("."):
            value = getattr(value, part)
        out[opt.key] = value
    return out


def shown(value: object) -> str:
    """A value as Hydra's override grammar writes it, in a code span."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(map(str, value)) + "]"
    elif isinstance(value, dict):
        text = "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    else:
        text = str(value)
    if len(text) > 60:  # a long string (a system prompt): its start, the rest in conf/
        text = text[:40].rstrip() + " ..."
    return f"`{text}`".replace("|", "\\|")


def selected(opts: list[Option], keys: list[str]) -> list[Option]:
    """The options `keys` name (a section brings every field under it); a key naming nothing
    raises ValueError."""
    out: list[Option] = []
    for key in keys:
        hits = [o for o in opts if o.key == key or o.key.startswith(key + ".")]
        if not hits:
            raise ValueError(f"no config field or section {key!r} (sparrow/train/config.py)")
        out += [o for o in hits if o not in out]
    return out


def table(opts: list[Option], composed: dict[str, object]) -> str:
    rows = ["| key | default | `make train` | what it does |", "|---|---|---|---|"]
    for o in opts:
        ours = composed.get(o.key, o.default)
        differs = shown(ours) if shown(ours) != shown(o.default) else ""
        doc = o.doc.replace("|", "\\|") or "**no doc comment**"
        rows.append(f"| `{o.key}` | {shown(o.default)} | {differs} | {doc} |")
    return "\n".join(rows) + "\n"


def bench_commands(source: Path = BENCH_CLI) -> list[tuple[str, str]]:
    """(subcommand, its comment) from the COMMANDS dict of sparrow/bench/cli.py."""
    found = []
    for line in source.read_text().splitlines():
        hit = re.match(r'\s+"([a-z-]+)": "sparrow\.bench\.\w+",\s*#\s*(.*)$', line)
        if hit:
            found.append((hit.group(1), hit.group(2)))
    return found


def bench_table() -> str:
    rows = ["| subcommand | what it measures |", "|---|---|"]
    rows += [f"| `{name}` | {what} |" for name, what in bench_commands()]
    return "\n".join(rows) + "\n"


def regenerate(guides: Path = GUIDES, opts: list[Option] | None = None) -> dict[Path, str]:
    """Each guide's text with its tables rewritten (not written)."""
    opts = options() if opts is None else opts
    composed = composed_defaults(opts)
    out = {}
    for path in sorted(guides.glob("*.md")):
        text = path.read_text()

        def options_block(m: re.Match) -> str:
            body = table(selected(opts, m.group("keys").split()), composed)
            return f"<!-- options: {m.group('keys')} -->\n{body}<!-- /options -->"

        try:
            text = OPTIONS.sub(options_block, text)
        except ValueError as err:
            raise ValueError(f"{_shown_path(path)}: {err}") from err
        text = BENCH.sub(lambda m: f"{BENCH_BEGIN}\n{bench_table()}{BENCH_END}", text)
        out[path] = text
    return out


def _shown_path(path: Path) -> str:
    return str(path.relative_to(REPO)) if REPO in path.parents else str(path)


def tabled_keys(texts: list[str], opts: list[Option]) -> set[str]:
    """The keys some guide's options marker brings into a table."""
    keys: set[str] = set()
    for text in texts:
        for m in OPTIONS.finditer(text):
            keys |= {o.key for o in selected(opts, m.group("keys").split())}
    return keys


def problems(opts: list[Option], texts: list[str]) -> list[str]:
    """One line per field without a doc comment and per field no guide tables."""
    lines = [f"{o.key} ({o.where}) has no doc comment" for o in opts if not o.doc]
    covered = tabled_keys(texts, opts)
    lines += [
        f"{o.key} ({o.where}) is in no docs/guide/ options table"
        for o in opts
        if o.key not in covered
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table is stale")
    args = parser.parse_args(argv)
    opts = options()
    texts = regenerate(opts=opts)
    stale = [path for path, text in texts.items() if path.read_text() != text]
    if not args.check:
        for path in stale:
            path.write_text(texts[path])
    bad = problems(opts, list(texts.values()))
    for line in bad:
        print(line, file=sys.stderr)
    if args.check and stale:
        print(
            f"stale: {', '.join(map(_shown_path, stale))} (run python -m "
            f"{__spec__.name if __spec__ else 'sparrow.cli.option_tables'})",
            file=sys.stderr,
        )
    if bad or (args.check and stale):
        return 1
    print("up to date" if not stale else f"rewrote {', '.join(map(_shown_path, stale))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
