"""Reference answers as datasets write them: `data.answer_extractor` names how the answer cell
becomes the string the reward compares with.

- `none`: the cell as it is (numbers become strings), e.g. a column that holds just "18".
- `gsm8k`: what follows the last `####` of a worked solution, as GSM8K writes it
  ("... she makes 9 * 2 = $<<9*2=18>>18.\\n#### 18" -> "18"); thousands commas are dropped
  ("#### 1,200" -> "1200"), as GSM8K's own scorers do.
- `boxed`: the content of the last `\\boxed{...}` (or `\\fbox{...}`), nested braces included, as
  MATH writes its solutions ("... = \\boxed{\\frac{1}{2}}" -> "\\frac{1}{2}").

Each returns None when the cell holds no answer (empty, no `####`, no closed box): the loader
skips that row and counts it, rather than train on a reference no completion can match.
"""

import re
from collections.abc import Callable

from sparrow.tasks.math_verifier import extract_boxed

# A comma between digits is a thousands separator; any other comma is kept.
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}\b)")


def _as_is(cell: str) -> str | None:
    return cell.strip() or None


def _after_hashes(cell: str) -> str | None:
    if "####" not in cell:
        return None
    answer = _THOUSANDS_COMMA.sub("", cell.rsplit("####", 1)[1].strip())
    return answer or None


def _boxed(cell: str) -> str | None:
    found = extract_boxed(cell)
    return found.strip() or None if found is not None else None


ANSWER_EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "none": _as_is,
    "gsm8k": _after_hashes,
    "boxed": _boxed,
}


def check_extractor(name: str) -> None:
    """Raise ValueError naming the choices when `name` is not an extractor."""
    if name not in ANSWER_EXTRACTORS:
        raise ValueError(
            f"data.answer_extractor={name!r} is not one of {sorted(ANSWER_EXTRACTORS)}"
        )


def extract_answer(name: str, cell: object) -> str | None:
    """The reference answer in `cell` by extractor `name`; None when the cell holds none."""
    if cell is None:
        return None
    return ANSWER_EXTRACTORS[name](str(cell))
