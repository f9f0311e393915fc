"""The guides (docs/guide/) and the README stay true to the code and short to read: every config
field has a doc comment and a line in a guide's generated table, the tables are current, every
config key or group option a guide names exists, every guide starts with a command, no paragraph
runs over 8 lines, and the README (at most 150 lines) links every guide (issue 63)."""

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sparrow.cli import option_tables
from sparrow.cli.moved_keys import MOVED

ROOT = Path(__file__).resolve().parents[2]
GUIDES = sorted((ROOT / "docs" / "guide").glob("*.md"))
MAX_PARAGRAPH_LINES = 8
SECTIONS = "model|data|rollout|schedule|controller|monitor|rl|actor|distill|logger|memory|cluster"
_KEY = re.compile(rf"(?<![\w/.+~-])[+~]?((?:{SECTIONS})(?:\.[a-z_0-9]+)+)")
_GROUP = re.compile(r"(?<![\w/.+~-])(model|data|rollout|schedule|controller|monitor|rl|actor|"
                    r"distill|logger|preset)=([a-z0-9_]+)\b")  # fmt: skip
_SPAN = re.compile(r"`([^`\n]+)`")
_FILE = (".json", ".jsonl", ".yaml", ".py", ".png", ".md", ".csv")  # rollout.json: a file
# The mistakes troubleshooting.md shows, on purpose.
MISTAKES = {"troubleshooting.md": {"rl.stepz"}}


@pytest.fixture(scope="module")
def opts():
    return option_tables.options()


def test_guides_exist():
    names = {p.stem for p in GUIDES}
    assert {"training", "your-model-data-reward", "monitor-and-controller", "rollout-correction",
            "multi-node", "checkpoints-and-faults", "memory-and-presets", "benchmarks",
            "gpu-check", "troubleshooting"} <= names  # fmt: skip


def test_every_config_field_has_a_doc_and_a_line_in_a_guide(opts):
    texts = [p.read_text() for p in GUIDES]
    assert len(opts) > 150
    assert option_tables.problems(opts, texts) == []


def test_the_guides_tables_are_generated_and_current(opts):
    stale = [p for p, text in option_tables.regenerate(opts=opts).items() if p.read_text() != text]
    assert not stale, f"stale: {stale} (run python -m sparrow.cli.option_tables)"


@dataclass
class _Section:
    documented: int = 0  # a field with its doc
    # a doc on the lines above
    above: str = "x"
    planted: int = 1


@dataclass
class _Root:
    section: _Section = field(default_factory=_Section)
    top: bool = True  # a run-level field


def test_a_planted_field_without_a_doc_or_a_guide_line_fails():
    planted = option_tables.options(_Root)
    assert [(o.key, o.doc) for o in planted] == [
        ("section.documented", "a field with its doc"),
        ("section.above", "a doc on the lines above"),
        ("section.planted", ""),
        ("top", "a run-level field"),
    ]
    guide = "<!-- options: section.documented section.above top -->\n<!-- /options -->\n"
    lines = option_tables.problems(planted, [guide])
    assert len(lines) == 2 and all(line.startswith("section.planted (tests/cli/") for line in lines)
    assert lines[0].endswith("has no doc comment")
    assert lines[1].endswith("is in no docs/guide/ options table")
    whole = "<!-- options: section top -->\n<!-- /options -->\n"
    assert option_tables.problems(planted, [whole]) == [lines[0]]  # tabled, still undocumented


def test_a_marker_naming_a_removed_key_fails(opts, tmp_path):
    (tmp_path / "g.md").write_text("<!-- options: rl.steps rl.no_such_key -->\n<!-- /options -->\n")
    with pytest.raises(ValueError, match="g.md: no config field or section 'rl.no_such_key'"):
        option_tables.regenerate(tmp_path, opts)


def _code(text: str) -> str:
    """The code blocks and inline code spans of a markdown text."""
    fenced = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S)
    indented = [line for line in text.splitlines() if line.startswith("    ")]
    return "\n".join([*fenced, *indented, *_SPAN.findall(text)])


def named_keys(text: str) -> set[str]:
    return {m.group(1) for m in _KEY.finditer(_code(text))}


def unknown_names(text: str, opts) -> list[str]:
    """Config keys and `group=option` choices the text's code names that do not exist."""
    keys = {o.key for o in opts}
    sections = {k.rsplit(".", i)[0] for k in keys for i in range(1, k.count(".") + 1)}
    bad = []
    for key in sorted(named_keys(text)):
        known = key in keys | sections or key in MOVED
        if not (known or key.startswith("rl.reward.kwargs.") or key.endswith(_FILE)):
            bad.append(key)
    for group, choice in set(_GROUP.findall(_code(text))):
        if not (ROOT / "conf" / group / f"{choice}.yaml").is_file():
            bad.append(f"{group}={choice}")
    return bad


@pytest.mark.parametrize("path", [ROOT / "README.md", *GUIDES], ids=lambda p: p.name)
def test_the_documents_name_only_keys_that_exist(path, opts):
    unknown = set(unknown_names(path.read_text(), opts)) - MISTAKES.get(path.name, set())
    assert not unknown


def test_a_removed_key_or_group_option_is_seen(opts):
    text = "Set `rl.correction.cap=3` and `controller.tau`, `+rl.reward.kwargs.w=1`.\n"
    assert unknown_names(text, opts) == []
    text += "```bash\nsparrow-train preset=tiniest rl.correction.capp=3\n```\nand `monitor.gone`\n"
    assert unknown_names(text, opts) == ["monitor.gone", "rl.correction.capp", "preset=tiniest"]


def paragraphs(text: str) -> list[tuple[int, int]]:
    """(first line, line count) of each prose paragraph: outside code blocks, tables, headings
    and HTML comments; a list item starts a paragraph of its own."""
    found: list[tuple[int, int]] = []
    start, count, fenced = 0, 0, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        prose = not fenced and line.strip() and not line.startswith(("|", "#", "<!--", "    "))
        prose = prose and not line.lstrip().startswith(("```", "~~~"))
        item = bool(re.match(r"\s*([-*]|\d+\.)\s", line))
        if count and (not prose or item):
            found.append((start, count))
            count = 0
        if prose:
            start, count = (number, 1) if count == 0 else (start, count + 1)
    if count:
        found.append((start, count))
    return found


@pytest.mark.parametrize("path", [ROOT / "README.md", *GUIDES], ids=lambda p: p.name)
def test_no_paragraph_runs_over_eight_lines(path):
    long = [(f"{path.name}:{at}", n) for at, n in paragraphs(path.read_text()) if n > 8]
    assert not long, f"paragraphs over {MAX_PARAGRAPH_LINES} lines (where, lines): {long}"


def test_the_paragraph_count_sees_a_long_one():
    text = "# T\n\n" + "word\n" * 9 + "\n```\n" + "code\n" * 20 + "```\n\n- a\n- b\n| t |\n"
    assert paragraphs(text) == [(3, 9), (36, 1), (37, 1)]


@pytest.mark.parametrize("path", GUIDES, ids=lambda p: p.name)
def test_every_guide_starts_with_a_command(path):
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    assert lines[0].startswith("# ") and lines[1] == "```bash", f"{path.name}: {lines[1]!r}"
    first = next(line for line in lines[2:] if not line.startswith("#"))
    assert re.match(r"(\. |sparrow-|make |bash |python |[A-Z_]+=)", first), first


def test_the_readme_is_short_and_links_every_guide():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert text.startswith("# sparrow\n\n```bash\nmake train   #")
    unlinked = [p.name for p in GUIDES if f"(docs/guide/{p.name})" not in text]
    assert not unlinked, unlinked


def test_the_presets_guide_names_every_preset():
    text = (ROOT / "docs" / "guide" / "memory-and-presets.md").read_text()
    missing = [
        p.stem for p in (ROOT / "conf" / "preset").glob("*.yaml") if f"`{p.stem}`" not in text
    ]
    assert not missing
