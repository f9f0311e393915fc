"""Schedule calibration: measure the p5 acceptance per position bin at each budget of a grid, and
pick per bin the cheapest budget that keeps p5 >= tau (the paper's offline lookup table).

Two ways to land on a schedule, both over a frozen policy (the tail depends on model, sparsity
and position, hardly on training progress: docs/DESIGN.md §1):
- `sweep_budgets` + `cheapest_schedule` (offline, `sparrow-calibrate`): every prompt is rolled out
  at every budget of the grid (`samples` sparse samples per budget, all from one shared prefill),
  then each sample is teacher-forced twice, densely and at its budget, in one `score` call that
  again shares the prompt; the exact full-vocabulary acceptance compares the two.
- `run_online` (`sparrow-calibrate --online STEPS`): the online controller's closed loop on fresh
  prompts each step, with the same exact acceptance, so the two results can be set side by side.

The dense side is the engine's own dense decode: its acceptance against the HF forward that the
actor runs is 1.000 at p5 in fp32 (tests/rollout, the noise floor), so no actor is needed here.
"""

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from sparrow.control.acceptance import BinStats, bin_acceptance, exact_acceptance
from sparrow.control.kv_read import dense_pages, kv_read_ratio
from sparrow.control.schedule import BudgetSchedule


@dataclass
class AcceptanceSample:
    """Per-token exact acceptance of a set of sparse rollouts, with what they read."""

    acceptance: list[torch.Tensor] = field(default_factory=list)  # (T_i,) per sequence
    positions: list[torch.Tensor] = field(default_factory=list)  # (T_i,) absolute positions
    pages_read: int = 0  # KV pages read per sparse layer, summed over generated tokens
    pages_dense: int = 0  # what dense decode would have read for the same tokens

    def add(self, other: "AcceptanceSample") -> None:
        self.acceptance += other.acceptance
        self.positions += other.positions
        self.pages_read += other.pages_read
        self.pages_dense += other.pages_dense

    def bin_stats(self, bin_tokens: int) -> list[BinStats]:
        if not self.acceptance:
            return []
        return bin_acceptance(torch.cat(self.acceptance), torch.cat(self.positions), bin_tokens)

    @property
    def kv_read_ratio(self) -> float:
        return kv_read_ratio(self.pages_read, self.pages_dense)


def pages_to_measure(
    prompt_tokens: int, max_new_tokens: int, num_samples: int, page_size: int
) -> int:
    """KV pages `measure_acceptance` holds at once for one prompt at most: its replay keeps
    2 x `num_samples` sequences cached (dense and sparse), sharing the prompt's full pages."""
    shared = prompt_tokens // page_size
    per_sequence = -(-(prompt_tokens + max_new_tokens) // page_size) - shared
    return shared + 2 * num_samples * per_sequence


@torch.no_grad()
def measure_acceptance(
    engine, prompt: list[int], schedules: list, params, temperature: float
) -> list[AcceptanceSample]:
    """Roll one prompt out once per entry of `schedules` (a shared prefill), replay each sample
    densely and under its own schedule (another shared prefill), and return per entry the exact
    acceptance of its tokens. Positions are absolute: the token at p attends over p tokens."""
    outs = engine.generate([prompt], params, n=len(schedules), schedules=schedules)
    completions = [o.token_ids for o in outs]
    k = len(outs)
    logits = engine.score([prompt] * 2 * k, completions * 2, schedules=[None] * k + schedules)
    t = temperature if temperature > 0 else 1.0
    page = engine.cfg.page_size
    samples = []
    for i, out in enumerate(outs):
        dense = F.log_softmax(logits[i].float() / t, -1)  # (T, V)
        sparse = F.log_softmax(logits[k + i].float() / t, -1)  # (T, V)
        positions = len(prompt) + torch.arange(len(out.token_ids))  # (T,)
        pages_dense = int(dense_pages(positions, page).sum())
        samples.append(
            AcceptanceSample(
                [exact_acceptance(dense, sparse)],
                [positions],
                int(out.budget_pages.sum()),
                pages_dense,
            )
        )
    return samples


def constant_budget(pages: int) -> Callable[[int], int]:
    return lambda context_tokens: pages


@dataclass
class BudgetSweep:
    bin_tokens: int  # width of a position bin
    by_budget: dict[int, AcceptanceSample]  # budget in pages -> its pooled tokens

    def stats(self) -> dict[int, list[BinStats]]:
        return {b: s.bin_stats(self.bin_tokens) for b, s in self.by_budget.items()}


def sweep_budgets(
    engine,
    prompts: Sequence[list[int]],
    budgets_pages: Sequence[int],
    params,
    samples_per_budget: int,
    bin_tokens: int,
    progress: bool = True,
) -> BudgetSweep:
    """Exact acceptance of `samples_per_budget` rollouts per prompt at every budget."""
    budgets = sorted(set(budgets_pages))
    schedules = [constant_budget(b) for b in budgets for _ in range(samples_per_budget)]
    pooled = {b: AcceptanceSample() for b in budgets}
    for prompt in tqdm(prompts, desc="calibrate", unit="prompt", disable=not progress):
        measured = measure_acceptance(engine, prompt, schedules, params, params.temperature)
        for j, sample in enumerate(measured):
            pooled[budgets[j // samples_per_budget]].add(sample)
    return BudgetSweep(bin_tokens, pooled)


@dataclass
class BinChoice:
    bin_index: int
    budget_pages: int  # chosen (after the monotone pass)
    reason: str  # "meets tau" | "no budget meets tau: largest" | "too few tokens: inherited"


def cheapest_schedule(
    sweep: BudgetSweep, tau: float, min_tokens: int, grid_pages: Sequence[int]
) -> tuple[BudgetSchedule, list[BinChoice]]:
    """Per bin the cheapest budget whose p5 >= tau (bins measured with >= min_tokens tokens at
    that budget), then made non-decreasing. A bin without enough tokens at any budget inherits the
    bin before it (the first measured bin's choice for bins before it); a bin where no budget
    meets tau gets the largest budget swept, and the choice says so."""
    stats = sweep.stats()
    budgets = sorted(stats)
    by_bin: dict[int, dict[int, BinStats]] = {}
    for b in budgets:
        for s in stats[b]:
            by_bin.setdefault(s.bin_index, {})[b] = s
    if not by_bin:
        raise ValueError("calibration measured no tokens: nothing to choose a schedule from")
    choices: list[BinChoice] = []
    for i in range(max(by_bin) + 1):
        enough = {b: s for b, s in by_bin.get(i, {}).items() if s.count >= min_tokens}
        if not enough:
            choices.append(BinChoice(i, 0, "too few tokens: inherited"))
            continue
        meeting = [b for b in sorted(enough) if enough[b].p5 >= tau]
        if meeting:
            choices.append(BinChoice(i, meeting[0], "meets tau"))
        else:
            choices.append(BinChoice(i, budgets[-1], "no budget meets tau: largest"))
    decided = [c.budget_pages for c in choices if c.budget_pages]
    if not decided:
        raise ValueError(
            f"no bin has >= {min_tokens} tokens at any budget: roll out more prompts or samples"
        )
    level = decided[0]
    for c in choices:  # inherit, then non-decreasing
        level = max(level, c.budget_pages)
        c.budget_pages = level
    grid = tuple(sorted(set(grid_pages) | set(budgets)))
    schedule = BudgetSchedule(sweep.bin_tokens, tuple(c.budget_pages for c in choices), grid)
    return schedule, choices


@dataclass
class OnlineStep:
    step: int
    budgets_pages: tuple[int, ...]  # schedule the step rolled out with
    stats: list[BinStats]  # exact acceptance per bin of that rollout
    kv_read_ratio: float
    actions: tuple[str, ...]  # the controller's decision per bin


def run_online(
    engine,
    controller,
    prompt_batches: Iterator[list[list[int]]],
    steps: int,
    samples_per_prompt: int,
    params,
    bin_tokens: int,
    progress: bool = True,
) -> list[OnlineStep]:
    """The online controller's loop on a frozen policy: roll out under the current schedule,
    measure the exact acceptance, let the controller move the schedule; one record per step."""
    history = []
    for step in tqdm(range(1, steps + 1), desc="online", unit="step", disable=not progress):
        schedule = controller.schedule
        pooled = AcceptanceSample()
        schedules = [schedule.budget_pages] * samples_per_prompt
        for prompt in next(prompt_batches):
            for sample in measure_acceptance(engine, prompt, schedules, params, params.temperature):
                pooled.add(sample)
        stats = pooled.bin_stats(bin_tokens)
        controller.update(stats)
        history.append(
            OnlineStep(
                step,
                schedule.budgets_pages,
                stats,
                pooled.kv_read_ratio,
                controller.last_actions,
            )
        )
    return history
