"""Budget controller: keeps each position bin's p5 acceptance above tau at the least KV budget.

Two modes, chosen once by `make_controller`:
- `FixedController`: the schedule as configured (the paper's offline lookup table).
- `OnlineController`: closed loop (sparrow's addition, docs/DESIGN.md §2). After each step, for
  every bin observed with >= min_tokens tokens:
    p5 < tau                    -> raise the bin one grid step (at once: safety first);
    p5 >= tau + margin          -> count an over-safe observation; after `patience` consecutive
                                   ones lower the bin one grid step;
    tau <= p5 < tau + margin    -> hold, and reset the over-safe count.
  Bins without enough tokens are left alone and keep their count (a rare long bin still
  accumulates consecutive observations). Monotonicity rule, one left-to-right pass:
  new[i] = max(proposal[i], new[i-1]). So raising bin i lifts every later bin below it, and a
  lowering never goes below the bin before it. A bin's over-safe count restarts whenever its
  budget changes, since the evidence was gathered at the old budget; a lowering blocked by the
  bin before it keeps the count, so the bin follows as soon as its predecessor drops.
  Budgets off the grid (e.g. from a preset) step to the nearest grid value above / below.
  Bins past the last listed one inherit the last budget (schedule semantics); the list grows to
  the furthest observed bin so each observed bin can move on its own.

Pure Python (no torch).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparrow.control.schedule import BudgetSchedule, ScheduleConfig, build_schedule

if TYPE_CHECKING:
    from sparrow.control.acceptance import BinStats


@dataclass
class ControllerConfig:
    tau: float = 0.86  # p5 acceptance a bin must keep (Sparrow: 0.86 trains like dense)
    margin: float = 0.03  # lower a bin only while its p5 >= tau + margin
    patience: int = 3  # consecutive over-safe observations of a bin before lowering it
    min_tokens: int = 200  # bins with fewer tokens in a step are not acted on
    start_smallest: bool = False  # online: start at the smallest grid budget everywhere
    # tail: each bin's p5 >= tau at the least budget; throughput (speculative rollouts only):
    # the budgets and k of the most expected tokens/s (throughput.py); auto: throughput with
    # rollout.speculative.enabled, else tail
    objective: str = "auto"

    def __post_init__(self):
        if not 0 < self.tau <= 1:  # an acceptance probability: above 1 no bin could ever pass
            raise ValueError(f"controller.tau must be in (0, 1], got {self.tau}")
        if self.objective not in OBJECTIVES:
            raise ValueError(
                f"controller.objective must be one of {OBJECTIVES}, got {self.objective!r}"
            )


OBJECTIVES = ("auto", "tail", "throughput")


def resolve_objective(objective: str, speculative: bool) -> str:
    """`tail` or `throughput`: auto is throughput with speculative rollouts (their samples are
    the dense policy's at any budget, so the budget buys speed alone), tail otherwise."""
    if objective == "auto":
        return "throughput" if speculative else "tail"
    if objective == "throughput" and not speculative:
        raise ValueError(
            "controller.objective=throughput needs rollout.speculative.enabled=true: without "
            "it the budget sets how far the samples are from the dense policy (use tail)"
        )
    return objective


def step_up(budget: int, grid: Sequence[int]) -> int:
    """Smallest grid budget above `budget`; `budget` itself at the top of the grid."""
    return next((g for g in grid if g > budget), budget)


def step_down(budget: int, grid: Sequence[int]) -> int:
    """Largest grid budget below `budget`; `budget` itself at the bottom of the grid."""
    return next((g for g in reversed(grid) if g < budget), budget)


class FixedController:
    """Mode `fixed`: never changes the schedule.

    The configured table wins over a checkpoint's: resuming with another table is how a run
    switches to a cheaper schedule by hand (the paper's move to the tau 0.80 table once
    DistillSparse has lifted its tail), as resuming with another `controller.tau` is in mode online.
    """

    def __init__(self, schedule: BudgetSchedule):
        self.schedule = schedule
        self.last_actions: tuple[str, ...] = ()

    def update(self, stats: "Sequence[BinStats]") -> BudgetSchedule:
        return self.schedule

    def state_dict(self) -> dict:
        return {"budgets_pages": list(self.schedule.budgets_pages)}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore: the schedule is the configured one (see the class docstring)."""


class OnlineController:
    """Mode `online`: the closed loop described in the module docstring."""

    def __init__(self, schedule: BudgetSchedule, cfg: ControllerConfig):
        if cfg.patience < 1 or cfg.min_tokens < 1:
            raise ValueError("controller patience and min_tokens must be >= 1")
        self.cfg = cfg
        self.schedule = schedule
        self.over_safe = [0] * schedule.num_bins  # consecutive over-safe observations per bin
        self.last_actions: tuple[
            str, ...
        ] = ()  # per bin: raise/lower/hold/empty/saturated[+lifted]

    def update(self, stats: "Sequence[BinStats]") -> BudgetSchedule:
        """Apply one step's per-bin stats (the monitor's `AcceptanceResult.stats`)."""
        cfg, grid = self.cfg, self.schedule.grid_pages
        by_bin = {s.bin_index: s for s in stats}  # the monitor bins by the schedule's bin_tokens
        observed = [b for b, s in by_bin.items() if s.count >= cfg.min_tokens]
        old = list(self.schedule.budgets_pages)
        n = max([len(old), *(b + 1 for b in observed)])
        old += [old[-1]] * (n - len(old))  # observed bins past the list inherit, then own a slot
        self.over_safe += [0] * (n - len(self.over_safe))

        new: list[int] = []
        actions: list[str] = []
        for i in range(n):
            s = by_bin.get(i)
            proposal, action = old[i], "hold"
            if s is None or s.count < cfg.min_tokens:
                action = "empty"
            elif s.p5 < cfg.tau:
                self.over_safe[i] = 0
                proposal = step_up(old[i], grid)
                action = "raise" if proposal > old[i] else "saturated"  # top of the grid
            elif s.p5 >= cfg.tau + cfg.margin:
                self.over_safe[i] += 1
                if self.over_safe[i] >= cfg.patience and old[i] > grid[0]:
                    proposal, action = step_down(old[i], grid), "lower"
            else:
                self.over_safe[i] = 0
            new.append(max(proposal, new[-1]) if new else proposal)
            if new[i] != proposal:
                action += "+lifted"  # lifted by the bin before it
            if new[i] != old[i]:
                self.over_safe[i] = 0
            actions.append(action)
        self.schedule = self.schedule.with_budgets(new)
        self.last_actions = tuple(actions)
        return self.schedule

    def state_dict(self) -> dict:
        return {
            "budgets_pages": list(self.schedule.budgets_pages),
            "over_safe": list(self.over_safe),
        }

    def load_state_dict(self, state: dict) -> None:
        budgets = list(state["budgets_pages"])
        # A throughput controller's state has no counts: they restart (objective changed).
        over_safe = list(state.get("over_safe", [0] * len(budgets)))
        if len(budgets) != len(over_safe):
            raise ValueError("controller state: budgets_pages and over_safe lengths differ")
        self.schedule = self.schedule.with_budgets(budgets)
        self.over_safe = over_safe


def make_controller(
    schedule_cfg: ScheduleConfig, cfg: ControllerConfig
) -> FixedController | OnlineController | None:
    """The controller of `schedule_cfg.mode`; None in dense mode (nothing to control)."""
    schedule = build_schedule(schedule_cfg)
    if schedule is None:
        return None
    if schedule_cfg.mode == "fixed":
        return FixedController(schedule)
    if cfg.start_smallest:
        schedule = schedule.with_budgets([schedule.grid_pages[0]])
    return OnlineController(schedule, cfg)
