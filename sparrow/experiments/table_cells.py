"""The values and cells every study table is made of: finite numbers out of metrics rows, their
means, a logged value with its 95% interval, and how each is printed ("-" for none)."""

import math
import statistics
from typing import TypeGuard

Interval = tuple[float, float, float]  # value, lower and upper end of its 95% interval


def finite(value) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and math.isfinite(value)


def finite_values(rows: list[dict], key: str) -> list[float]:
    """`key`'s finite values over `rows` (rows without it, or with NaN or inf, left out)."""
    return [v for r in rows if finite(v := r.get(key))]


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def interval(row: dict, key: str) -> Interval | None:
    """`key` with its logged `_lo95` and `_hi95` ends, None when the row lacks it."""
    if key not in row:
        return None
    return row[key], row[f"{key}_lo95"], row[f"{key}_hi95"]


def cell(value: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if value is None else fmt.format(value)


def ci_cell(value: Interval | None, fmt: str = "{:.3f}") -> str:
    """'value (lo to hi)'."""
    if value is None:
        return "-"
    v, lo, hi = (fmt.format(x) for x in value)
    return f"{v} ({lo} to {hi})"
