"""Which part of the program is running, read off the Python stack: the frames of named
functions, identified by file (under sparrow/) and function name. Reading the stack needs no
hook in the code under rehearsal, so nothing of sparrow's is patched to mark its phases.

    decode = StackRegions({"decode forward": {("sparrow/rollout/model_runner.py", "_forward")}})
    decode()  # "decode forward" while a ModelRunner._forward frame is on the stack, else None
"""

import sys
from pathlib import Path

import sparrow

SPARROW = str(Path(sparrow.__file__).resolve().parent)


def sparrow_frames(limit: int = 4, skip: int = 1) -> list[tuple[str, int, str]]:
    """(path under sparrow/, line, function) of the innermost `limit` frames under sparrow/."""
    frames, f = [], sys._getframe(skip)
    while f is not None and len(frames) < limit:
        path = f.f_code.co_filename
        if path.startswith(SPARROW):
            frames.append(("sparrow" + path[len(SPARROW) :], f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return frames


def where(frame: tuple[str, int, str]) -> str:
    path, line, function = frame
    return f"{path}:{line} ({function})"


class StackRegions:
    def __init__(self, regions: dict[str, set[tuple[str, str]]]):
        """regions: name -> {(path under sparrow/, function name)}; a region is entered while
        a frame of one of its functions is on the stack."""
        self._by_function = {key: name for name, keys in regions.items() for key in keys}
        self._by_code: dict = {}  # code object -> region name or None, filled as frames are seen

    def __call__(self) -> str | None:
        """The innermost region on the stack, or None (called per op: code objects are looked
        up once)."""
        if not self._by_function:
            return None
        by_code = self._by_code
        f = sys._getframe(1)
        while f is not None:
            code = f.f_code
            name = by_code.get(code, _UNSEEN)
            if name is _UNSEEN:
                name = by_code[code] = self._region_of(code)
            if name is not None:
                return name
            f = f.f_back
        return None

    def _region_of(self, code) -> str | None:
        path = code.co_filename
        if not path.startswith(SPARROW):
            return None
        return self._by_function.get(("sparrow" + path[len(SPARROW) :], code.co_name))


_UNSEEN = object()
