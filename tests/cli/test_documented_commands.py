"""Every sparrow command the documents print names an entry point that exists, and its arguments
parse with that entry point's own parser; the commands that only ask for information run.

Documents: README.md, docs/DESIGN.md, docs/guide/*.md and docs/*/README.md. Commands: the lines
of code blocks (fenced or indented; `\\` continuations joined, `# comments` and leading
`VAR=value` dropped) and the inline code spans (table cells, prose) that start with
`sparrow-<tool>` or `python -m sparrow.<module>`. A span that is only a tool's name
(`sparrow-report`, `sparrow-bench decode`) names it: it must exist, there is nothing to parse.

Parsing runs the real entry point in this process and stops it at its parser: the first
argparse parse (whose left-over arguments, where the parser keeps them, must then compose as
Hydra overrides) or, for `sparrow-train`, the config composition. No work runs: an entry point
that got past its parser without being stopped fails the test. A removed module, a renamed
console script or bench subcommand, a renamed flag or config key fails here the day it happens.

What runs (in a temporary folder, as a subprocess): commands whose arguments only ask for
information (`--help`, `-h`, `--status`, `--cfg`, `dry_run=true`): a rule, so a new one runs
without being listed. The documents' other commands are measurements and studies (minutes to
hours, some detached, some rewriting docs/); they are parsed here, each bench subcommand runs
end to end at a tiny shape in tests/bench/test_every_subcommand.py, and README's "Using it"
block runs with the fewest steps under `-m slow` in tests/cli/test_readme_commands.py.
"""

import argparse
import contextlib
import importlib.metadata
import importlib.util
import os
import re
import runpy
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

import sparrow.cli.config_loader as config_loader
from sparrow.bench.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [
    ROOT / "README.md",
    ROOT / "docs/DESIGN.md",
    *sorted(ROOT.glob("docs/guide/*.md")),
    *sorted(ROOT.glob("docs/*/README.md")),
]
INFORMATION_ONLY = ("--help", "-h", "--status", "--cfg", "dry_run=true")
_START = re.compile(r"^(sparrow-[a-z]+|python3? -m sparrow[.\w]*)(\s|$)")
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*\s+")
_FENCE = re.compile(r"^\s*(```|~~~)")
_SPAN = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]  # as a shell splits the command
    where: str  # document:line
    mention: bool  # an inline span naming a tool, no arguments: nothing to parse

    @property
    def program(self) -> str:  # `sparrow-bench` or `python -m` module
        return self.words[2] if self.words[0].startswith("python") else self.words[0]

    @property
    def args(self) -> list[str]:
        return list(self.words[3:] if self.words[0].startswith("python") else self.words[1:])

    def __str__(self) -> str:
        return f"{shlex.join(self.words)}  ({self.where})"


def _command(text: str, where: str, inline: bool) -> Command | None:
    text = " ".join(text.split())
    while _ENV.match(text):  # PYTHONPATH=... sparrow-bench ...
        text = _ENV.sub("", text, count=1)
    if not _START.match(text):
        return None
    words = tuple(shlex.split(text))
    name_words = 3 if words[0].startswith("python") else 2 if words[0] == "sparrow-bench" else 1
    return Command(words, where, mention=inline and len(words) <= name_words)


def extract(text: str, name: str) -> list[Command]:
    """The commands of one markdown document (see the module docstring)."""
    commands, prose = [], []
    lines = text.splitlines()
    fenced, i = False, 0
    while i < len(lines):
        line, start = lines[i], i
        if _FENCE.match(line):
            fenced = not fenced
            prose.append("")
            i += 1
            continue
        code = fenced or (line.startswith("    ") and not line.lstrip().startswith(("-", "*")))
        if not code:
            prose.append(line)
            i += 1
            continue
        while line.rstrip().endswith("\\") and i + 1 < len(lines):  # a continued command
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i]
        i += 1
        prose += [""] * (i - start)
        shell = re.sub(r"(^|\s)#.*$", "", line).strip()
        found = _command(shell, f"{name}:{start + 1}", inline=False)
        if found:
            commands.append(found)
    text = "\n".join(prose)
    for span in _SPAN.finditer(text):
        line_start = text.rfind("\n", 0, span.start()) + 1
        where = f"{name}:{text.count(chr(10), 0, span.start()) + 1}"
        # A table's cell is a command even without arguments; in prose a bare name is a mention.
        found = _command(span.group(1), where, inline=text[line_start] != "|")
        if found:
            commands.append(found)
    return commands


def documented_commands() -> list[Command]:
    return [c for doc in DOCUMENTS for c in extract(doc.read_text(), str(doc.relative_to(ROOT)))]


COMMANDS_FOUND = documented_commands()


def _id(command: Command) -> str:
    return re.sub(r"[^\w.=-]+", "_", " ".join(command.words))[:80] + "@" + command.where


class Parsed(BaseException):  # not an Exception: no entry point's handler may catch it
    def __init__(self, left_over: list[str]):
        self.left_over = left_over


@contextlib.contextmanager
def stop_after_parsing():
    """argparse's outermost parse, and the config composition, raise Parsed once they succeed
    (a subparser's parse and a composition inside load_config do not)."""
    depth = {"argparse": 0, "config": 0}
    originals = {
        "parse_args": argparse.ArgumentParser.parse_args,
        "parse_known_args": argparse.ArgumentParser.parse_known_args,
        "load_config": config_loader.load_config,
        "compose_dict": config_loader.compose_dict,
    }

    def stopping(kind: str, original, left_over):
        def call(*args, **kwargs):
            depth[kind] += 1
            try:
                result = original(*args, **kwargs)
            finally:
                depth[kind] -= 1
            if depth[kind] == 0:
                raise Parsed(left_over(result))
            return result

        return call

    patches = {
        "parse_args": stopping("argparse", originals["parse_args"], lambda r: []),
        "parse_known_args": stopping("argparse", originals["parse_known_args"], lambda r: r[1]),
        "load_config": stopping("config", originals["load_config"], lambda r: []),
        "compose_dict": stopping("config", originals["compose_dict"], lambda r: []),
    }
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    argv = sys.argv
    try:
        for name in ("parse_args", "parse_known_args"):
            setattr(argparse.ArgumentParser, name, patches[name])
        for name in ("load_config", "compose_dict"):
            setattr(config_loader, name, patches[name])
        yield
    finally:
        for name in ("parse_args", "parse_known_args"):
            setattr(argparse.ArgumentParser, name, originals[name])
        for name in ("load_config", "compose_dict"):
            setattr(config_loader, name, originals[name])
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        sys.argv = argv


def console_script(name: str):
    scripts = importlib.metadata.entry_points(group="console_scripts")
    found = [ep for ep in scripts if ep.name == name]
    assert found, f"no console script {name} (setup.py's entry_points; reinstall after a change)"
    return found[0]


def check_exists(command: Command) -> None:
    if command.words[0].startswith("python"):
        module = command.program
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, f"no module {module}: {command}"
        source = Path(spec.origin).read_text()
        assert 'if __name__ == "__main__"' in source, f"{module} cannot run as -m: {command}"
        # Its own parser, or a declared study's (sparrow.experiments.study builds it).
        parser = "ArgumentParser(" in source or "study_main(" in source
        assert parser, f"{module} has no argument parser: {command}"
        return
    script = console_script(command.program)
    script.load()
    if command.program == "sparrow-bench" and command.args and command.args[0][0] != "-":
        assert command.args[0] in COMMANDS, f"no sparrow-bench subcommand: {command}"


def parse_only(command: Command, capsys) -> list[str]:
    """Run the entry point up to its parser; returns the arguments its parser left to compose
    as Hydra overrides. Fails on a parser's error and on work run past the parser."""
    with stop_after_parsing():
        try:
            if command.words[0].startswith("python"):
                sys.argv = [command.program, *command.args]
                runpy.run_module(command.program, run_name="__main__", alter_sys=True)
                code = 0
            else:
                sys.argv = [command.program, *command.args]
                code = console_script(command.program).load()()
        except Parsed as parsed:
            return parsed.left_over
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    err = capsys.readouterr().err.strip().splitlines()
    asks_help = any(a in ("--help", "-h") for a in command.args)
    assert code == 0 and asks_help, (
        f"{command} exited {code} at its parser: {err[-1:]}"
        if code
        else f"{command} ran without reaching an argument parser"
    )
    return []


def test_the_documents_name_commands():
    programs = {c.program for c in COMMANDS_FOUND}
    assert {"sparrow-train", "sparrow-bench", "sparrow.experiments.distill_study"} <= programs
    assert "sparrow-eval" in programs  # README: scoring a run's exported policy (issue 50)


def test_extract_reads_code_blocks_tables_and_spans():
    doc = """# x

```bash
make train   # sparrow-train on its default
sparrow-train preset=smoke    # two steps
PYTHONPATH=a:$PWD \\
    sparrow-bench kernel --aot --json a.json
```

    sparrow-calibrate data=long_context \\
        --budgets 16,32

| figure | command |
|---|---|
| a | `python -m sparrow.experiments.parity_study`; `sparrow-bench decode --json P` |

Run C (`sparrow-generate --n 2
--max-tokens 4`, 2 min); the `sparrow-report` dashboards; `sparrow/cli/` and `make test`.
"""
    got = [(" ".join(c.words), c.where, c.mention) for c in extract(doc, "d.md")]
    assert got == [
        ("sparrow-train preset=smoke", "d.md:5", False),
        ("sparrow-bench kernel --aot --json a.json", "d.md:6", False),
        ("sparrow-calibrate data=long_context --budgets 16,32", "d.md:10", False),
        ("python -m sparrow.experiments.parity_study", "d.md:15", False),
        ("sparrow-bench decode --json P", "d.md:15", False),
        ("sparrow-generate --n 2 --max-tokens 4", "d.md:17", False),
        ("sparrow-report", "d.md:18", True),
    ]


def check(command: Command, capsys) -> None:
    check_exists(command)
    if command.mention:
        return
    left_over = parse_only(command, capsys)
    if left_over:  # what sparrow-bench step and sparrow-calibrate compose after their flags
        config_loader.load_config(left_over)


@pytest.mark.parametrize("command", COMMANDS_FOUND, ids=_id)
def test_documented_command_names_an_entry_point_and_parses(command, capsys):
    check(command, capsys)


@pytest.mark.parametrize(
    "line",
    [
        "python -m sparrow.experiments.distill_experiment --steps 0",  # a module removed
        "python -m sparrow.experiments.parity_study --no-such-flag",
        "sparrow-trainer preset=tiny",  # a console script renamed
        "sparrow-bench decode-steps --json a.json",  # a bench subcommand renamed
        "sparrow-bench kernel --contexts many",
        "sparrow-bench step --json a.json not-an-override",
        "sparrow-bench step --json a.json rl.no_such_key=1",
        "sparrow-train rl.no_such_key=1",
        "sparrow-train preset=tiny --cfg job rl.no_such_key=1",
        "sparrow-calibrate --budgets 4,8 --no-such-flag",
        "sparrow-eval runs/default --samples many",
        "sparrow-eval",  # its policy is required
        "sparrow-report",  # its run directory is required
    ],
)
def test_a_broken_command_fails_the_check(line, capsys):
    (command,) = extract(f"```bash\n{line}\n```\n", "planted.md")
    with pytest.raises((AssertionError, config_loader.ConfigError)):
        check(command, capsys)


def _informational() -> list[Command]:
    """The commands that only ask for information, each distinct one once (the guides repeat a
    few, e.g. `sparrow-train preset=tiny --cfg job`)."""
    found: dict[tuple[str, ...], Command] = {}
    for c in COMMANDS_FOUND:
        if not c.mention and set(c.args) & set(INFORMATION_ONLY):
            found.setdefault(c.words, c)
    return list(found.values())


INFORMATIONAL = _informational()


@pytest.mark.parametrize("command", INFORMATIONAL, ids=_id)
def test_documented_information_command_runs(command, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    env |= {"HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true", "PYTHONPATH": str(ROOT)}
    words = list(command.words)
    if words[0].startswith("python"):
        words[0] = sys.executable
    else:
        words[0] = str(Path(sys.executable).with_name(words[0]))
    done = subprocess.run(
        words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, f"{command}: {done.stderr[-2000:]}"
    assert done.stdout.strip(), f"{command} printed nothing"
