"""The speculative acceptance of a step's rollouts (rollout.speculative): the per-bin acceptance
sum_v min(p, q) the monitor measures, taken where speculative mode has it.

A speculative row records the dense pass's distributions, so the row-level acceptance the
monitor computes (accept/...) compares the dense engine with the dense trainer: the noise floor.
The drafts' acceptance is measured inside each round instead, at every draft the rule tested,
between the processed distributions the rule compares (rollout/outputs.py DraftAcceptance).
Here it is pooled over ranks and binned by position with the monitor's bins and percentiles
(control/acceptance.py): per bin over all budgets for the metrics, and per (bin, budget) for the
throughput controller (control/throughput.py). Beside it: the tokens a verify pass realised per
sequence, the draft and accept counts and the draft/verify time split.
"""

from functools import reduce
from operator import add

import torch

from sparrow.control.acceptance import bin_acceptance
from sparrow.control.throughput import BudgetBinStats
from sparrow.distributed import Ranks
from sparrow.rollout.outputs import DraftAcceptance, GenerateStats


def draft_acceptance(
    stats: GenerateStats, bin_tokens: int, ranks: Ranks
) -> tuple[dict[str, float], list[BudgetBinStats]]:
    """(spec/* metrics, per-(bin, budget) stats) of this rank's generate `stats`, all ranks
    pooled (a collective: every rank calls it)."""
    drafts: DraftAcceptance = reduce(add, ranks.gather(stats.spec_accept))
    verified = ranks.sum(stats.spec_verified)
    accepted = ranks.sum(stats.spec_accepted)
    metrics = {
        "spec/rounds": ranks.sum(stats.spec_rounds),
        "spec/drafted": ranks.sum(stats.spec_drafted),
        "spec/accepted": accepted,
        # Tokens a verify pass emitted per sequence: its accepted drafts and one more.
        "spec/tokens_per_verify": (accepted + verified) / verified if verified else float("nan"),
        "spec/draft_s": ranks.sum(stats.spec_draft_s) / ranks.world,  # rank mean
        "spec/verify_s": ranks.sum(stats.spec_verify_s) / ranks.world,
    }
    if not drafts.values:
        return metrics, []
    values = torch.tensor(drafts.values, dtype=torch.float64)  # (N,)
    positions = torch.tensor(drafts.positions)  # (N,)
    budgets = torch.tensor(drafts.budget_pages)  # (N,)
    metrics["spec/accept/mean"] = float(values.mean())
    for s in bin_acceptance(values, positions, bin_tokens):
        metrics[f"spec/accept/bin{s.bin_index}/mean"] = s.mean
        metrics[f"spec/accept/bin{s.bin_index}/p5"] = s.p5
        metrics[f"spec/accept/bin{s.bin_index}/count"] = s.count
    by_budget = []
    for budget in torch.unique(budgets).tolist():
        at = budgets == budget
        for s in bin_acceptance(values[at], positions[at], bin_tokens):
            by_budget.append(BudgetBinStats(int(budget), s))
    return metrics, by_budget
