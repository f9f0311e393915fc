"""The rollout-correction study's report (sparrow.experiments.correction_study): each run's
metrics.jsonl copied into docs/correction/runs/<run>/, then a row per run and a row per arm read
from those copies alone, and a plot of held-out accuracy per arm, written between the table
markers of docs/correction/README.md."""

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
from sparrow.experiments.table_cells import (
    Interval,
    cell,
    ci_cell,
    finite,
    finite_values,
    interval,
    mean,
)


@dataclass(frozen=True)
class CorrectionRun:
    name: str
    arm: str
    steps_logged: int
    steps_total: int
    before: Interval | None  # held-out accuracy at step 0 (Wilson interval)
    after: Interval | None  # at the last evaluation
    delta: Interval | None  # after - before on the same prompts (paired interval, as logged)
    updates: int  # steps whose update ran (not skipped: no signal, or non-finite)
    groups_drawn: float  # groups rolled out per step (mean over steps)
    groups_kept: float | None  # with dynamic sampling: groups trained on per step (mean)
    round_limit_steps: int  # with dynamic sampling: steps that hit the round limit
    kv_read: float | None  # mean KV-read ratio over steps
    truncated: float | None  # mean share of tokens whose weight the correction truncated
    masked: float | None  # mean share of tokens whose loss the correction dropped
    train_min: float  # minutes in training steps (the trainer's clock, time/step_s summed)


def summarize_run(runs_dir: Path, name: str, steps: int, prompts_per_step: int) -> CorrectionRun:
    rows = rows_by_step(runs_dir / name)
    evals = [rows[s] for s in sorted(rows) if "eval/accuracy" in rows[s]]
    train = [r for s, r in sorted(rows.items()) if s > 0 and "reward/mean" in r]
    sampled = [r for r in train if "sampling/groups_drawn" in r]
    last = evals[-1] if len(evals) > 1 else {}
    return CorrectionRun(
        name=name,
        arm=name.rsplit("_s", 1)[0],
        steps_logged=max((s for s in rows if s > 0), default=0),
        steps_total=steps,
        before=interval(evals[0], "eval/accuracy") if evals else None,
        after=interval(last, "eval/accuracy"),
        delta=interval(last, "eval/delta"),
        updates=sum(
            1 for r in train if not r.get("update/no_signal") and not r.get("update/skipped")
        ),
        groups_drawn=mean([r["sampling/groups_drawn"] for r in sampled]) or float(prompts_per_step),
        groups_kept=mean([r["sampling/groups_kept"] for r in sampled]),
        round_limit_steps=sum(1 for r in sampled if r["sampling/round_limit_hit"]),
        kv_read=mean([r["kv_read_ratio"] for r in train if finite(r.get("kv_read_ratio"))]),
        truncated=mean(finite_values(train, "correction/truncated_frac")),
        masked=mean(finite_values(train, "correction/masked_frac")),
        train_min=sum(finite_values(train, "time/step_s")) / 60,
    )


def format_runs(runs: list[CorrectionRun]) -> str:
    lines = [
        "| run | steps | held-out before (95% CI) | after (95% CI) | after - before (paired 95% "
        "CI) | updates | groups drawn / step | groups kept / step | round limit hit | KV-read "
        "| truncated | masked | train min |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r.name} | {r.steps_logged}/{r.steps_total} | {ci_cell(r.before)} "
            f"| {ci_cell(r.after)} "
            f"| {ci_cell(r.delta, '{:+.3f}')} | {r.updates} | {r.groups_drawn:.1f} | "
            f"{cell(r.groups_kept, '{:.1f}')} | {r.round_limit_steps if r.groups_kept else '-'} | "
            f"{cell(r.kv_read, '{:.2f}')} | {cell(r.truncated, '{:.4f}')} | "
            f"{cell(r.masked, '{:.4f}')} | {r.train_min:.1f} |"
        )
    return "\n".join(lines) + "\n"


def format_arms(runs: list[CorrectionRun]) -> str:
    """Per arm over its finished runs: mean and (min-max over seeds) of each figure."""
    lines = [
        "| arm | seeds | held-out after | gain over before | updates | groups drawn / step "
        "| KV-read | train min |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_arm = defaultdict(list)
    for r in runs:
        if r.after is not None and r.before is not None and r.steps_logged == r.steps_total:
            by_arm[r.arm].append(r)

    def spread(values: list[float], fmt: str) -> str:
        return f"{fmt.format(statistics.fmean(values))} ({fmt.format(min(values))} to " + (
            f"{fmt.format(max(values))})"
        )

    for arm, done in by_arm.items():
        kv = [r.kv_read for r in done if r.kv_read is not None]
        # every run here has both (filtered above); the checks say so to the type checker
        after = [r.after[0] for r in done if r.after is not None]
        gains = [r.after[0] - r.before[0] for r in done if r.after and r.before]
        lines.append(
            f"| {arm} | {len(done)} | {spread(after, '{:.3f}')} | "
            f"{spread(gains, '{:+.3f}')} | "
            f"{spread([float(r.updates) for r in done], '{:.1f}')} | "
            f"{spread([r.groups_drawn for r in done], '{:.1f}')} | "
            f"{spread(kv, '{:.2f}') if kv else '-'} | "
            f"{spread([r.train_min for r in done], '{:.1f}')} |"
        )
    return "\n".join(lines) + "\n"


def plot_accuracy(runs: list[CorrectionRun], out: Path) -> None:
    """Held-out accuracy after training, a dot per seed with its 95% interval, per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(dict.fromkeys(r.arm for r in runs))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, arm in enumerate(arms):
        done = [r.after for r in runs if r.arm == arm and r.after is not None]
        for j, (value, lo, hi) in enumerate(done):
            x = i + (j - (len(done) - 1) / 2) * 0.12
            ax.errorbar(x, value, yerr=[[value - lo], [hi - value]], fmt="o", color=f"C{i}")
    before = [r.before[0] for r in runs if r.before is not None]
    if before:
        ax.axhline(statistics.fmean(before), color="k", lw=0.8, ls="--", label="before training")
        ax.legend(fontsize=7)
    ax.set_xticks(range(len(arms)), arms, fontsize=8)
    ax.set_ylabel("held-out accuracy after training")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "accuracy.png", dpi=110)
    plt.close(fig)


def write_correction_report(
    root: Path, runs: list, steps: dict, prompts_per_step: int, docs: Path
) -> Path:
    """Copy what ROOT holds into DOCS/runs, then the table and plot from DOCS/runs alone."""
    names = [r.name for r in runs]
    copy_metrics(root, names, docs)
    summaries = [summarize_run(docs / "runs", n, steps[n], prompts_per_step) for n in names]
    logged = [s for s in summaries if s.steps_logged or s.before is not None]
    if logged:
        plot_accuracy(logged, docs / "plots")
    stamp = datetime.datetime.now().isoformat(timespec="minutes")
    block = (
        f"{TABLE_BEGIN}\nGenerated by `python -m sparrow.experiments.correction_study --report` "
        f"from `docs/correction/runs/*/metrics.jsonl` on {stamp}.\n\nPer arm (finished runs; "
        "mean, and the range over seeds):\n\n"
        + format_arms(summaries)
        + "\nPer run:\n\n"
        + format_runs(summaries)
        + TABLE_END
    )
    readme = splice_table(docs, block, "Rollout correction at an aggressive sparse budget")
    print(f"table: {readme}; plot: {docs / 'plots' / 'accuracy.png'}")
    return readme
