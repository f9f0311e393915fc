"""The parity study's report (sparrow.experiments.parity_study): a row per run and a row per arm
from the runs' metrics.jsonl, and plots of reward, held-out accuracy, KV-read and p5 per arm,
written between markers into docs/parity/README.md."""

import datetime
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from sparrow.experiments.study_files import (
    TABLE_BEGIN,
    TABLE_END,
    rows_by_step,
    run_wall_s,
    splice_table,
)
from sparrow.experiments.table_cells import cell, finite, mean

SETTLED_AFTER = 3  # steps the controller needs to leave its start budget; excluded from means
_P5_BIN = re.compile(r"^accept/p5/bin(\d+)$")
MIN_TOKENS = 50  # the default controller.min_tokens: a bin's p5 counts from this many tokens


@dataclass(frozen=True)
class ParityRun:
    name: str
    arm: str
    steps_logged: int
    steps_total: int
    before: float | None  # held-out accuracy at step 0
    after: float | None  # at the last evaluation
    delta: tuple[float, float, float] | None  # after - before, paired 95% CI (as logged)
    reward: list[float]  # train reward per step
    kv_read: float | None  # mean over steps after SETTLED_AFTER
    p5_by_bin: dict[int, float]  # median over steps of each bin's p5 (bins with a p5 logged)
    # share of steps whose every bin with >= MIN_TOKENS tokens has p5 >= tau - 0.02
    p5_held: float | None
    tis_truncated: float | None  # mean share of tokens whose TIS weight was truncated
    updates: int  # steps whose update ran (not skipped for lack of signal)
    wall_h: float


def summarize_run(root: Path, name: str, steps: int, tau: float = 0.86) -> ParityRun:
    rows = rows_by_step(root / name)
    evals = [s for s, r in sorted(rows.items()) if "eval/accuracy" in r]
    last = rows[evals[-1]] if evals else {}
    train = [r for s, r in sorted(rows.items()) if s > 0 and "reward/mean" in r]
    settled = [r for s, r in sorted(rows.items()) if s > SETTLED_AFTER and "reward/mean" in r]
    p5 = defaultdict(list)
    held = []
    for r in settled:
        bins = {int(m[1]): v for k, v in r.items() if (m := _P5_BIN.match(k)) and finite(v)}
        for b, v in bins.items():
            p5[b].append(v)
        counted = [v for b, v in bins.items() if r.get(f"accept/count/bin{b}", 0) >= MIN_TOKENS]
        if counted:
            held.append(all(v >= tau - 0.02 for v in counted))
    delta = None
    if "eval/delta" in last:
        delta = (last["eval/delta"], last["eval/delta_lo95"], last["eval/delta_hi95"])
    return ParityRun(
        name=name,
        arm=name.rsplit("_s", 1)[0],
        steps_logged=max((s for s in rows if s > 0), default=0),
        steps_total=steps,
        before=rows[evals[0]]["eval/accuracy"] if evals else None,
        after=last.get("eval/accuracy") if len(evals) > 1 else None,
        delta=delta,
        reward=[r["reward/mean"] for r in train],
        kv_read=mean([r["kv_read_ratio"] for r in settled if finite(r.get("kv_read_ratio"))]),
        p5_by_bin={b: statistics.median(v) for b, v in sorted(p5.items())},
        p5_held=mean([float(h) for h in held]),
        tis_truncated=mean([t for r in train if finite(t := truncated_frac(r))]),
        updates=sum(1 for r in train if not r.get("update/no_signal")),
        wall_h=run_wall_s(root, name) / 3600,
    )


def truncated_frac(row: dict) -> float | None:
    """The step's share of TIS-truncated tokens (`update/tis_truncated_frac` in logs written
    before the rollout-correction modes, `correction/truncated_frac` since)."""
    return row.get("correction/truncated_frac", row.get("update/tis_truncated_frac"))


def _get(key: str):
    return lambda row: row.get(key)


def format_runs(runs: list[ParityRun]) -> str:
    lines = [
        "| run | steps | held-out before -> after | after - before (95% CI) | train reward "
        "first 3 -> last 3 | updates | KV-read | p5 per bin (median) | steps p5 >= tau-0.02 | "
        "TIS truncated | wall (h) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        delta = (
            "-"
            if r.delta is None
            else f"{r.delta[0]:+.3f} ({r.delta[1]:+.3f} to {r.delta[2]:+.3f})"
        )
        reward = "-"
        if r.reward:
            reward = (
                f"{statistics.fmean(r.reward[:3]):.3f} -> {statistics.fmean(r.reward[-3:]):.3f}"
            )
        p5 = " ".join(f"b{b}:{v:.2f}" for b, v in r.p5_by_bin.items()) or "-"
        lines.append(
            f"| {r.name} | {r.steps_logged}/{r.steps_total} | "
            f"{cell(r.before)} -> {cell(r.after)} | "
            f"{delta} | {reward} | {r.updates} | {cell(r.kv_read, '{:.2f}')} | {p5} | "
            f"{cell(r.p5_held, '{:.0%}')} | {cell(r.tis_truncated, '{:.4f}')} | {r.wall_h:.2f} |"
        )
    return "\n".join(lines) + "\n"


def format_arms(runs: list[ParityRun]) -> str:
    """Per arm over its finished runs: final accuracy mean and seed range, mean paired gain."""
    lines = [
        "| arm | finished seeds | held-out after: mean (min-max over seeds) | mean gain over "
        "before | mean KV-read | mean TIS truncated |",
        "|---|---|---|---|---|---|",
    ]
    by_arm = defaultdict(list)
    for r in runs:
        if r.after is not None and r.steps_logged == r.steps_total:
            by_arm[r.arm].append(r)
    for arm, done in by_arm.items():
        # every run here has both (an after needs a second evaluation, so a first one)
        after = [r.after for r in done if r.after is not None]
        gains = [r.after - r.before for r in done if r.after is not None and r.before is not None]
        kv = mean([r.kv_read for r in done if r.kv_read is not None])
        tis = mean([r.tis_truncated for r in done if r.tis_truncated is not None])
        lines.append(
            f"| {arm} | {len(done)} | {statistics.fmean(after):.3f} ({min(after):.3f}-"
            f"{max(after):.3f}) | {statistics.fmean(gains):+.3f} | {cell(kv, '{:.2f}')} | "
            f"{cell(tis, '{:.4f}')} |"
        )
    return "\n".join(lines) + "\n"


def plot_arms(root: Path, runs: list[ParityRun], out: Path) -> None:
    """One figure per metric, a line per run, colored by arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    colors = {"online": "tab:blue", "dense": "tab:gray", "aggressive": "tab:red"}
    panels = {
        "reward": (_get("reward/mean"), "train reward"),
        "eval_accuracy": (_get("eval/accuracy"), "held-out accuracy"),
        "kv_read_ratio": (_get("kv_read_ratio"), "KV-read ratio"),
        "p5_min": (_get("accept/p5_min"), "smallest per-bin p5"),
        "tis_truncated": (truncated_frac, "TIS-truncated token share"),
    }
    for file, (value, label) in panels.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for r in runs:
            rows = rows_by_step(root / r.name)
            points = [(s, value(row)) for s, row in sorted(rows.items()) if finite(value(row))]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker=".", color=colors.get(r.arm), alpha=0.8, label=r.name)
        if file == "p5_min":
            ax.axhline(0.86, color="k", lw=0.8, ls="--", label="tau")
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.legend(fontsize=6, ncol=3)
        fig.tight_layout()
        fig.savefig(out / f"{file}.png", dpi=110)
        plt.close(fig)


def write_parity_report(root: Path, runs: list, steps: dict, docs: Path) -> Path:
    summaries = [summarize_run(root, r.name, steps[r.name]) for r in runs]
    logged = [s for s in summaries if s.steps_logged or s.before is not None]
    if logged:
        plot_arms(root, logged, docs / "plots")
    stamp = datetime.datetime.now().isoformat(timespec="minutes")
    block = (
        f"{TABLE_BEGIN}\nGenerated by `sparrow.experiments.parity_study` from "
        f"`{root.name}/*/metrics.jsonl` on {stamp}.\n\nPer arm (finished runs only):\n\n"
        + format_arms(summaries)
        + "\nPer run:\n\n"
        + format_runs(summaries)
        + TABLE_END
    )
    readme = splice_table(docs, block, "Parity study")
    print(f"table: {readme}; plots: {docs / 'plots'}")
    return readme
