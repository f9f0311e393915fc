"""The stability study's table (sparrow.experiments.stability_study): one summary row per run
from its metrics.jsonl (held-out accuracy with its 95% interval, train reward, KV-read ratio, p5,
rollout speedup vs the dense run, wall time from the study's status.jsonl), written between
markers into a README next to sparrow-report's overlay plots."""

import datetime
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from sparrow.cli.report import main as report_main
from sparrow.experiments.study_files import (
    REPO,
    TABLE_BEGIN,
    TABLE_END,
    rows_by_step,
    run_wall_s,
    splice_table,
)
from sparrow.experiments.table_cells import cell, mean


def _values(rows: dict[int, dict], key: str, training_only: bool = True) -> list[float]:
    return [
        float(r[key])
        for s, r in sorted(rows.items())
        if (s > 0 or not training_only)
        and isinstance(r.get(key), (int, float))
        and math.isfinite(r[key])
    ]


def _rollout_tok_s(rows: dict[int, dict]) -> float | None:
    tokens = sum(_values(rows, "rollout/tokens"))
    seconds = sum(_values(rows, "time/rollout_s"))
    return tokens / seconds if seconds > 0 else None


@dataclass(frozen=True)
class RunSummary:
    name: str
    setting: str
    steps_logged: int
    steps_total: int
    eval_step: int | None  # step of the last held-out evaluation
    accuracy: tuple[float, float, float] | None  # (accuracy, lo95, hi95) at eval_step
    first_accuracy: float | None  # at the first evaluation (step 0)
    reward_first: float | None  # mean train reward over the first 5 steps
    reward_last: float | None  # over the last 5 logged steps
    kv_read_ratio: float | None  # mean over steps
    p5_min: float | None  # median over steps of the smallest per-bin p5
    speedup: float | None  # rollout speedup vs dense
    speedup_source: str  # "measured (n steps)", "tok/s vs dense", "reference" or "-"
    speedup_predicted: float | None  # cost model's mean prediction
    wall_h: float  # wall time of all invocations of this run


def summarize(root: Path, run, steps: int, dense_tok_s: float | None) -> RunSummary:
    rows = rows_by_step(root / run.name)
    evals = [s for s, r in sorted(rows.items()) if "eval/accuracy" in r]
    last = rows[evals[-1]] if evals else None
    reward = _values(rows, "reward/mean")
    measured = _values(rows, "speedup/measured")
    tok_s = _rollout_tok_s(rows)
    if run.name == "dense":
        speedup, source = (1.0, "reference") if tok_s else (None, "-")
    elif measured:
        speedup, source = statistics.fmean(measured), f"measured ({len(measured)} steps)"
    elif tok_s and dense_tok_s:
        speedup, source = tok_s / dense_tok_s, "tok/s vs dense"
    else:
        speedup, source = None, "-"
    return RunSummary(
        name=run.name,
        setting=run.setting,
        steps_logged=max((s for s in rows if s > 0), default=0),
        steps_total=steps,
        eval_step=evals[-1] if evals else None,
        accuracy=(
            (last["eval/accuracy"], last["eval/accuracy_lo95"], last["eval/accuracy_hi95"])
            if last
            else None
        ),
        first_accuracy=rows[evals[0]]["eval/accuracy"] if evals else None,
        reward_first=statistics.fmean(reward[:5]) if reward else None,
        reward_last=statistics.fmean(reward[-5:]) if reward else None,
        kv_read_ratio=mean(_values(rows, "kv_read_ratio")),
        p5_min=statistics.median(p5) if (p5 := _values(rows, "accept/p5_min")) else None,
        speedup=speedup,
        speedup_source=source,
        speedup_predicted=mean(_values(rows, "speedup/predicted")),
        wall_h=run_wall_s(root, run.name) / 3600,
    )


def format_table(summaries: list[RunSummary]) -> str:
    head = (
        "| run | setting | steps | held-out accuracy (95% CI) | first eval | train reward "
        "first 5 -> last 5 | mean KV-read ratio | median p5 min | rollout speedup | "
        "predicted | wall (h) |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for s in summaries:
        acc = (
            f"{s.accuracy[0]:.3f} ({s.accuracy[1]:.3f}-{s.accuracy[2]:.3f}) at step {s.eval_step}"
            if s.accuracy
            else "-"
        )
        speedup = "-" if s.speedup is None else f"{s.speedup:.2f}x {s.speedup_source}"
        lines.append(
            f"| {s.name} | {s.setting} | {s.steps_logged}/{s.steps_total} | {acc} | "
            f"{cell(s.first_accuracy)} | {cell(s.reward_first)} -> {cell(s.reward_last)} | "
            f"{cell(s.kv_read_ratio)} | {cell(s.p5_min)} | {speedup} | "
            f"{cell(s.speedup_predicted, '{:.2f}x')} | {s.wall_h:.2f} |"
        )
    return head + "\n".join(lines) + "\n"


def write_report(root: Path, runs: list, steps: dict, docs: Path) -> Path:
    """Overlay plots (sparrow-report) under docs/plots and the table into docs/README.md."""
    dense = rows_by_step(root / "dense")
    dense_tok_s = _rollout_tok_s(dense) if dense else None
    summaries = [summarize(root, r, steps[r.name], dense_tok_s) for r in runs]
    logged = [root / r.name for r in runs if (root / r.name / "metrics.jsonl").is_file()]
    if logged:
        report_main([*map(str, logged), "--out", str(docs / "plots")])
    incomplete = [s.name for s in summaries if s.steps_logged < s.steps_total]
    stamp = datetime.datetime.now().isoformat(timespec="minutes")
    block = (
        f"{TABLE_BEGIN}\n"
        f"Generated by `sparrow.experiments.stability_study` from "
        f"`{_display(root)}/*/metrics.jsonl` on "
        f"{stamp}."
        + (f" Incomplete runs: {', '.join(incomplete)}." if incomplete else "")
        + "\n\n"
        + format_table(summaries)
        + f"{TABLE_END}"
    )
    readme = splice_table(docs, block, "Stability study")
    print(f"table: {readme}; plots: {docs / 'plots'}")
    return readme


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)
