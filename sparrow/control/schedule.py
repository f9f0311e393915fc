"""Budget schedule: KV pages read per sparse layer, as a non-decreasing step function of the context
length (Sparrow's dynamic schedule, one value per position bin).

The token at absolute position t is produced attending over t context tokens, so its budget is
`budget_pages(t)`, and the monitor bins it as t // bin_tokens: the monitor is given the schedule's
`bin_tokens`, so the two bin alike. Budgets count pages of the engine's page size
(rollout.engine.page_size, the one place it is set). Past the last listed bin the last budget
applies.

The YAML form (conf/schedule/*.yaml) is a flat mapping of `ScheduleConfig` fields, valid both for
`load_schedule_config` and as a Hydra config-group file:

    mode: fixed
    bin_tokens: 2000
    budgets_pages: [32, 64, 96]
    grid_pages: [32, 64, 96, 128]

Pure Python (no torch), so it is tested in milliseconds.
"""

from dataclasses import asdict, dataclass, field, fields
from itertools import pairwise
from pathlib import Path

import yaml

MODES = ("dense", "fixed", "online")
DEFAULT_GRID_PAGES = (4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass
class ScheduleConfig:
    mode: str = "fixed"  # dense: no sparsity; fixed: budgets as listed; online: controller adapts
    # Width of a schedule bin in context tokens (the paper uses 2,000); the monitor's bins too.
    bin_tokens: int = 2000
    budgets_pages: list[int] = field(default_factory=list)  # pages per bin; last one extends
    grid_pages: list[int] = field(default_factory=lambda: list(DEFAULT_GRID_PAGES))  # steps

    def __post_init__(self):  # in every mode: a dense run's monitor bins by it too
        if self.bin_tokens <= 0:
            raise ValueError(f"schedule.bin_tokens must be positive, got {self.bin_tokens}")


@dataclass(frozen=True)
class BudgetSchedule:
    bin_tokens: int  # width of a bin in context tokens
    budgets_pages: tuple[int, ...]  # pages per sparse layer for each bin, non-decreasing
    grid_pages: tuple[int, ...] = DEFAULT_GRID_PAGES  # budgets the controller steps between

    def __post_init__(self):
        validate(self.bin_tokens, self.budgets_pages, self.grid_pages)

    @property
    def num_bins(self) -> int:
        return len(self.budgets_pages)

    def bin_of(self, context_tokens: int) -> int:
        """Schedule bin of a context length (may be past the last listed bin)."""
        return context_tokens // self.bin_tokens

    def budget_pages(self, context_tokens: int) -> int:
        """Pages per sparse layer for a step attending over `context_tokens` tokens. The engine
        attends densely when this is >= the context's page count."""
        return self.budgets_pages[min(self.bin_of(context_tokens), self.num_bins - 1)]

    def with_budgets(self, budgets_pages: list[int] | tuple[int, ...]) -> "BudgetSchedule":
        return BudgetSchedule(self.bin_tokens, tuple(budgets_pages), self.grid_pages)

    def to_config(self, mode: str = "fixed") -> ScheduleConfig:
        return ScheduleConfig(
            mode, self.bin_tokens, list(self.budgets_pages), list(self.grid_pages)
        )


def validate(bin_tokens: int, budgets_pages: tuple[int, ...], grid_pages: tuple[int, ...]) -> None:
    """Raise ValueError with a one-line reason if the schedule is malformed."""
    if bin_tokens <= 0:
        raise ValueError(f"bin_tokens must be positive, got {bin_tokens}")
    if not budgets_pages:
        raise ValueError("budgets_pages is empty: give at least one budget (or mode: dense)")
    bad = [b for b in budgets_pages if not isinstance(b, int) or b <= 0]
    if bad:
        raise ValueError(f"budgets_pages must be positive integers, got {bad}")
    for i in range(1, len(budgets_pages)):
        if budgets_pages[i] < budgets_pages[i - 1]:
            raise ValueError(
                f"budgets_pages must be non-decreasing: bin {i} has {budgets_pages[i]} "
                f"< bin {i - 1}'s {budgets_pages[i - 1]}"
            )
    if not grid_pages or any(not isinstance(g, int) or g <= 0 for g in grid_pages):
        raise ValueError(f"grid_pages must be non-empty positive integers, got {list(grid_pages)}")
    if any(b <= a for a, b in pairwise(grid_pages)):
        raise ValueError(f"grid_pages must be strictly increasing, got {list(grid_pages)}")


def build_schedule(cfg: ScheduleConfig) -> BudgetSchedule | None:
    """The schedule a config describes; None in dense mode (every step attends densely)."""
    if cfg.mode not in MODES:
        raise ValueError(f"schedule mode must be one of {MODES}, got {cfg.mode!r}")
    if cfg.mode == "dense":
        return None
    return BudgetSchedule(cfg.bin_tokens, tuple(cfg.budgets_pages), tuple(cfg.grid_pages))


def load_schedule_config(path: str | Path) -> ScheduleConfig:
    """Read a schedule YAML (a flat mapping of ScheduleConfig fields); unknown keys are errors."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a schedule file must be a mapping of ScheduleConfig fields")
    if "page_size" in data:  # schedule files before issue 48 held a copy of the engine's
        raise ValueError(
            f"{path}: page_size is no schedule key: the page size is rollout.engine.page_size "
            "alone; delete the line"
        )
    known = {f.name for f in fields(ScheduleConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown schedule keys {unknown}; known: {sorted(known)}")
    cfg = ScheduleConfig(**data)
    try:
        build_schedule(cfg)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return cfg


def save_schedule_config(cfg: ScheduleConfig, path: str | Path, comment: str = "") -> None:
    """Write `cfg` as YAML (lists in flow style, one line each), with optional header comment."""
    build_schedule(cfg)
    header = "".join(f"# {line}\n" for line in comment.splitlines())
    body = yaml.safe_dump(asdict(cfg), sort_keys=False, default_flow_style=None, width=100)
    Path(path).write_text(header + body)
