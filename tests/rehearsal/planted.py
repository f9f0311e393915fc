"""Planting a fault in a copy of a sparrow function, so that a test can show the rehearsal names
the planted line.

    copy, site = planted(DecoderModel._forward, "x, h = self._add_norm(", "x.sum().item()")
    monkeypatch.setattr(DecoderModel, "_forward", copy)   # in the test only
    # site == "sparrow/rollout/model.py:312": the rehearsal's message must name it

The copy is compiled from the function's source with `statement; ` put in front of the first
line holding `anchor` (a simple statement, so the line stays one line), under the module's own
file name and line numbers: a frame in the copy reports the real file and line, which is what the
rehearsal's stack walk reads. The module's globals are the copy's globals.
"""

import inspect
import textwrap
from collections.abc import Callable
from pathlib import Path

import sparrow

SPARROW = Path(sparrow.__file__).resolve().parent


def planted(func: Callable, anchor: str, statement: str) -> tuple[Callable, str]:
    """(copy of `func` running `statement` first on its line holding `anchor`, "path:line" of
    that line with the path under sparrow/)."""
    lines, first = inspect.getsourcelines(func)
    hits = [i for i, line in enumerate(lines) if anchor in line]
    if len(hits) != 1:
        raise ValueError(f"anchor {anchor!r} is on {len(hits)} lines of {func.__qualname__}")
    line = lines[hits[0]]
    indent = line[: len(line) - len(line.lstrip())]
    lines[hits[0]] = f"{indent}{statement}; {line.lstrip()}"
    source = textwrap.dedent("".join(lines))
    path = Path(inspect.getsourcefile(func)).resolve()
    code = compile("\n" * (first - 1) + source, str(path), "exec")
    namespace: dict = {}
    exec(code, func.__globals__, namespace)  # noqa: S102  (the function's own source, edited)
    site = f"sparrow/{path.relative_to(SPARROW).as_posix()}:{first + hits[0]}"
    return namespace[func.__name__], site
