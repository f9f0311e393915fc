"""Throughput controller (`controller.objective=throughput`, the default with speculative
rollouts): per position bin the budget, and per step the number of drafts k, that maximise
expected tokens per second.

With speculative rollouts every sample is the dense policy's whatever the budget (speculative.py),
so the budget no longer trades accuracy for speed: it trades the drafts' acceptance a against
their cost. A round of k drafts emits E = (1 - a^(k+1)) / (1 - a) tokens per sequence for k
sparse decode steps and one dense verify of k + 1 positions (cost_model.py); `rate(bin, budget,
a, k)` is that E over the round's eFLOPs at the bin's context, and a is the bin's measured mean
acceptance at that budget (the drafts the rule tested, rollout/outputs.py DraftAcceptance).

After each step, for every bin with >= min_tokens tested drafts at some budget, the step's mean
acceptance at each budget is recorded (the latest measurement of a (bin, budget) wins). Then:
- one k for the step (the engine drafts k tokens for every sequence): the k of 1..8 that
  minimises the step's predicted eFLOPs, sum over observed bins of tokens_b / rate(bin, best
  budget of the bin at k, a, k), tokens_b the bin's tested drafts this step;
- per bin at that k: the measured budget of the highest rate; when that budget has a grid
  neighbour not measured yet in the bin, the bin moves there instead (the lower one first) to
  measure it: a local search that stops where both neighbours are measured and slower.
  Exploring costs throughput only, never exactness (every budget's samples are the dense
  policy's), so it needs no margin or patience. In schedule mode `fixed` the budgets stay as
  configured and only k moves.
Monotonicity as the tail controller's: new[i] = max(proposal[i], new[i-1]).

Pure Python: the cost model comes in as `rate`.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparrow.control.controller import ControllerConfig, step_down, step_up
from sparrow.control.schedule import BudgetSchedule

if TYPE_CHECKING:
    from sparrow.control.acceptance import BinStats

DRAFT_TOKENS = tuple(range(1, 9))  # the k the controller chooses among
Rate = Callable[[int, int, float, int], float]  # (bin, budget pages, a, k) -> tokens per eFLOP


@dataclass
class BudgetBinStats:
    """A bin's acceptance at one budget (the drafts tested there, one step, all ranks)."""

    budget_pages: int
    stats: "BinStats"


class ThroughputController:
    """The module docstring's rule. `schedule`: the starting budgets; `draft_tokens`: the
    starting k; `move_budgets`: False in schedule mode fixed (k alone moves)."""

    def __init__(
        self,
        schedule: BudgetSchedule,
        cfg: ControllerConfig,
        rate: Rate,
        draft_tokens: int,
        move_budgets: bool = True,
    ):
        self.cfg, self.rate, self.move_budgets = cfg, rate, move_budgets
        self.schedule = schedule
        self.draft_tokens = draft_tokens
        self.measured: dict[tuple[int, int], float] = {}  # (bin, budget pages) -> mean a
        self.last_actions: tuple[str, ...] = ()  # per bin: move/explore/hold/empty[+lifted]

    def update(self, stats: Sequence[BudgetBinStats]) -> BudgetSchedule:
        """Apply one step's per-(bin, budget) acceptance of the drafts."""
        tokens: dict[int, int] = {}
        for s in stats:
            if s.stats.count >= self.cfg.min_tokens:
                # An acceptance: a mean over rounded fp32 sums may pass 1 by an ulp.
                self.measured[(s.stats.bin_index, s.budget_pages)] = min(1.0, s.stats.mean)
                tokens[s.stats.bin_index] = tokens.get(s.stats.bin_index, 0) + s.stats.count
        if not tokens:
            self.last_actions = ("empty",) * self.schedule.num_bins
            return self.schedule
        self.draft_tokens = min(DRAFT_TOKENS, key=lambda k: self._step_cost(tokens, k))
        old = list(self.schedule.budgets_pages)
        n = max(len(old), max(tokens) + 1)
        old += [old[-1]] * (n - len(old))  # observed bins past the list inherit, then own a slot
        new: list[int] = []
        actions: list[str] = []
        for i in range(n):
            proposal, action = old[i], "empty"
            if i in tokens and self.move_budgets:
                proposal, action = self._choose(i, self.draft_tokens)
                if action == "move" and proposal == old[i]:
                    action = "hold"
            elif i in tokens:
                action = "hold"
            new.append(max(proposal, new[-1]) if new else proposal)
            actions.append(action + ("+lifted" if new[i] != proposal else ""))
        self.schedule = self.schedule.with_budgets(new)
        self.last_actions = tuple(actions)
        return self.schedule

    def _best(self, bin_index: int, k: int) -> tuple[int, float]:
        """(budget, rate) of the bin's measured budget with the highest rate at k."""
        options = [(b, self.rate(bin_index, b, a, k)) for (i, b), a in self.measured.items()
                   if i == bin_index]  # fmt: skip
        return max(options, key=lambda option: option[1])

    def _step_cost(self, tokens: dict[int, int], k: int) -> float:
        """The step's predicted eFLOPs at k: each bin's tokens at its best budget's rate."""
        return sum(n / self._best(i, k)[1] for i, n in tokens.items())

    def _choose(self, bin_index: int, k: int) -> tuple[int, str]:
        best, _ = self._best(bin_index, k)
        grid = self.schedule.grid_pages
        for neighbour in (step_down(best, grid), step_up(best, grid)):
            if neighbour != best and (bin_index, neighbour) not in self.measured:
                return neighbour, "explore"
        return best, "move"

    def state_dict(self) -> dict:
        return {
            "budgets_pages": list(self.schedule.budgets_pages),
            "draft_tokens": self.draft_tokens,
            "measured": [[i, b, a] for (i, b), a in self.measured.items()],
        }

    def load_state_dict(self, state: dict) -> None:
        """A throughput controller's state, or a tail controller's (its budgets: a run resumed
        with the other objective starts from where the last one left the schedule)."""
        self.schedule = self.schedule.with_budgets(list(state["budgets_pages"]))
        self.draft_tokens = int(state.get("draft_tokens", self.draft_tokens))
        self.measured = {(int(i), int(b)): float(a) for i, b, a in state.get("measured", [])}
