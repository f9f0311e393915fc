"""The speculative study's report (sparrow.experiments.speculative_study): each run's
metrics.jsonl copied into docs/speculative/runs/<run>/, then, from those copies alone, a row per
run, a row per arm, and the rollout phase's time speculative / dense per step of each seed's pair,
written between the table markers of docs/speculative/README.md."""

import datetime
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from sparrow.experiments.study_files import (
    TABLE_BEGIN,
    TABLE_END,
    copy_metrics,
    rows_by_step,
    splice_table,
)
from sparrow.experiments.table_cells import Interval, cell, ci_cell, finite_values, interval, mean

# The ratios a lossless rollout holds at 1: the correction's weights and the mismatch monitor's.
RATIO_KEYS = (
    "correction/weight_min",
    "correction/weight_max",
    "mismatch/ratio_min",
    "mismatch/ratio_max",
)


@dataclass(frozen=True)
class SpeculativeRun:
    name: str
    arm: str
    seed: str
    steps_logged: int
    steps_total: int
    before: Interval | None  # held-out accuracy at step 0 (Wilson interval)
    after: Interval | None  # at the last evaluation
    delta: Interval | None  # after - before on the same prompts (paired interval, as logged)
    reward: float | None  # mean training reward over the steps
    rollout_s: dict[int, float]  # the rollout phase's seconds, by step
    rollout_tok_s: float | None  # mean rollout tokens/s over the steps
    acceptance: float | None  # mean of spec/accept/mean (the drafts' acceptance)
    tokens_per_verify: float | None  # mean of spec/tokens_per_verify
    worst_ratio: float | None  # max over steps of |ratio - 1| (RATIO_KEYS)


def summarize_run(runs_dir: Path, name: str, steps: int) -> SpeculativeRun:
    rows = rows_by_step(runs_dir / name)
    evals = [rows[s] for s in sorted(rows) if "eval/accuracy" in rows[s]]
    train = [r for s, r in sorted(rows.items()) if s > 0 and "reward/mean" in r]
    last = evals[-1] if len(evals) > 1 else {}
    ratios = [abs(v - 1) for key in RATIO_KEYS for v in finite_values(train, key)]
    arm, seed = name.rsplit("_s", 1)
    return SpeculativeRun(
        name=name,
        arm=arm,
        seed=seed,
        steps_logged=max((s for s in rows if s > 0), default=0),
        steps_total=steps,
        before=interval(evals[0], "eval/accuracy") if evals else None,
        after=interval(last, "eval/accuracy"),
        delta=interval(last, "eval/delta"),
        reward=mean(finite_values(train, "reward/mean")),
        rollout_s={int(r["step"]): r["time/rollout_s"] for r in train if "time/rollout_s" in r},
        rollout_tok_s=mean(finite_values(train, "throughput/rollout_tok_s")),
        acceptance=mean(finite_values(train, "spec/accept/mean")),
        tokens_per_verify=mean(finite_values(train, "spec/tokens_per_verify")),
        worst_ratio=max(ratios) if ratios else None,
    )


def format_runs(runs: list[SpeculativeRun]) -> str:
    lines = [
        "| run | steps | held-out before (95% CI) | after (95% CI) | after - before (paired 95% "
        "CI) | train reward | rollout s / step | rollout tok/s | acceptance | tokens / verify "
        "| max \\|ratio - 1\\| |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r.name} | {r.steps_logged}/{r.steps_total} | {ci_cell(r.before)} "
            f"| {ci_cell(r.after)} | {ci_cell(r.delta, '{:+.3f}')} | {cell(r.reward)} "
            f"| {cell(mean(list(r.rollout_s.values())), '{:.1f}')} "
            f"| {cell(r.rollout_tok_s, '{:.1f}')} | {cell(r.acceptance)} "
            f"| {cell(r.tokens_per_verify, '{:.2f}')} | {cell(r.worst_ratio, '{:.1e}')} |"
        )
    return "\n".join(lines) + "\n"


def _spread(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return f"{fmt.format(statistics.fmean(values))} ({low} to {high})"


def format_arms(runs: list[SpeculativeRun]) -> str:
    """Per arm over its finished runs: mean and (min to max over seeds) of each figure."""
    lines = [
        "| arm | seeds | held-out after | gain over before | train reward | rollout s / step "
        "| max \\|ratio - 1\\| |",
        "|---|---|---|---|---|---|---|",
    ]
    by_arm = defaultdict(list)
    for r in runs:
        if r.after is not None and r.before is not None and r.steps_logged == r.steps_total:
            by_arm[r.arm].append(r)
    for arm, done in by_arm.items():
        after = [r.after[0] for r in done if r.after is not None]
        gains = [r.after[0] - r.before[0] for r in done if r.after and r.before]
        rollout = [statistics.fmean(r.rollout_s.values()) for r in done if r.rollout_s]
        worst = [r.worst_ratio for r in done if r.worst_ratio is not None]
        lines.append(
            f"| {arm} | {len(done)} | {_spread(after, '{:.3f}')} | {_spread(gains, '{:+.3f}')} "
            f"| {_spread([r.reward for r in done if r.reward is not None], '{:.3f}')} "
            f"| {_spread(rollout, '{:.1f}')} | {cell(max(worst) if worst else None, '{:.1e}')} |"
        )
    return "\n".join(lines) + "\n"


def step_ratios(runs: list[SpeculativeRun]) -> dict[int, dict[str, float]]:
    """Per step, per seed with both arms logged there: speculative / dense rollout seconds."""
    by_key = {(r.arm, r.seed): r for r in runs}
    ratios: dict[int, dict[str, float]] = defaultdict(dict)
    for (arm, seed), spec in by_key.items():
        dense = by_key.get(("dense", seed))
        if arm != "speculative" or dense is None:
            continue
        for step in sorted(set(spec.rollout_s) & set(dense.rollout_s)):
            ratios[step][seed] = spec.rollout_s[step] / dense.rollout_s[step]
    return dict(sorted(ratios.items()))


def format_step_ratios(runs: list[SpeculativeRun]) -> str:
    ratios = step_ratios(runs)
    seeds = sorted({seed for per_seed in ratios.values() for seed in per_seed}, key=int)
    head = " | ".join(f"s{s}" for s in seeds)
    lines = [
        f"| step | {head} | mean |" if seeds else "| step | mean |",
        "|---|" + "---|" * (len(seeds) + 1),
    ]
    for step, per_seed in ratios.items():
        cells = " | ".join(cell(per_seed.get(s), "{:.2f}") for s in seeds)
        lines.append(f"| {step} | {cells} | {statistics.fmean(per_seed.values()):.2f} |")
    every = [v for per_seed in ratios.values() for v in per_seed.values()]
    if every:
        lines.append(
            f"| all ({len(every)} pairs) | {' | '.join('' for _ in seeds)} | "
            f"{_spread(every, '{:.2f}')} |"
        )
    return "\n".join(lines) + "\n"


def write_speculative_report(root: Path, runs: list, steps: dict, docs: Path) -> Path:
    """Copy what ROOT holds into DOCS/runs, then the tables from DOCS/runs alone."""
    names = [r.name for r in runs]
    copy_metrics(root, names, docs)
    summaries = [summarize_run(docs / "runs", n, steps[n]) for n in names]
    summaries = [s for s in summaries if s.steps_logged or s.before is not None]
    stamp = datetime.datetime.now().isoformat(timespec="minutes")
    block = (
        f"{TABLE_BEGIN}\nGenerated by `python -m sparrow.experiments.speculative_study --report` "
        f"from `docs/speculative/runs/*/metrics.jsonl` on {stamp}.\n\nPer arm (finished runs; "
        "mean, and the range over seeds):\n\n"
        + format_arms(summaries)
        + "\nThe rollout phase's time, speculative / dense, per step (each seed's pair):\n\n"
        + format_step_ratios(summaries)
        + "\nPer run:\n\n"
        + format_runs(summaries)
        + TABLE_END
    )
    readme = splice_table(docs, block, "Lossless speculative rollouts")
    print(f"table: {readme}")
    return readme
