"""The DistillSparse study's report (sparrow.experiments.distill_study), from the files under
docs/distill/runs/ alone: each run's metrics.jsonl (copied there by the study) and, for adapter
runs, tail.json (sparrow.experiments.distill_tail). Written between markers into
docs/distill/README.md.

    python -m sparrow.experiments.distill_table   # regenerate the table from docs/distill/runs
"""

import argparse
import datetime
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from sparrow.experiments.study_files import TABLE_BEGIN, TABLE_END, rows_by_step, splice_table
from sparrow.experiments.table_cells import cell, mean

REPO = Path(__file__).resolve().parents[2]
SETTLED_AFTER = 5  # steps the controller takes to leave its start budget: out of the KV means
KL_KEY = "distill/kl_topk"
_BUDGET = re.compile(r"^schedule/budget_pages/bin(\d+)$")


@dataclass(frozen=True)
class DistillRun:
    name: str  # <arm>_s<seed>
    arm: str
    steps: int  # training steps logged
    sparse_tokens: list[float]  # per step: tokens decoded sparsely (rollout/sparse_tokens)
    tokens: list[float]  # per step: completion tokens
    kv_read: list[float]  # per step after SETTLED_AFTER
    kl_first: float | None  # mean top-K KL of the adapter's training rollouts, first 5 steps
    kl_last: float | None  # and last 5 steps
    p5_min: float | None  # median over settled steps of the smallest per-bin p5
    budgets: list[int]  # the schedule after the last step, pages per bin
    step_h: float  # sum of the steps' time (model load and checkpoints not included)
    step_s_median: float | None  # a step's time, median over steps: a step slowed by another
    # process on the 2 cores (an OpenMP thread waiting for a busy core) moves the sum, not this
    tail: dict | None  # tail.json (adapter runs)


def _finite(values) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def summarize(run_dir: Path) -> DistillRun:
    rows = [r for s, r in sorted(rows_by_step(run_dir).items()) if s > 0]
    kl = _finite(r.get(KL_KEY) for r in rows)
    last = rows[-1] if rows else {}
    budgets = sorted((int(m[1]), v) for k, v in last.items() if (m := _BUDGET.match(k)))
    tail = run_dir / "tail.json"
    return DistillRun(
        name=run_dir.name,
        arm=run_dir.name.rsplit("_s", 1)[0],
        steps=len(rows),
        sparse_tokens=_finite(r.get("rollout/sparse_tokens") for r in rows),
        tokens=_finite(r.get("rollout/tokens") for r in rows),
        kv_read=_finite(r.get("kv_read_ratio") for r in rows[SETTLED_AFTER:]),
        kl_first=mean(kl[:5]),
        kl_last=mean(kl[-5:]) if len(kl) > 5 else None,
        p5_min=statistics.median(p5)
        if (p5 := _finite(r.get("accept/p5_min") for r in rows))
        else None,  # fmt: skip
        budgets=[int(v) for _, v in budgets],
        step_h=sum(_finite(r.get("time/step_s") for r in rows)) / 3600,
        step_s_median=statistics.median(t)
        if (t := _finite(r.get("time/step_s") for r in rows))
        else None,  # fmt: skip
        tail=json.loads(tail.read_text()) if tail.is_file() else None,
    )


def _spread(values: list[float], fmt: str = "{:.3f}") -> str:
    """mean ± sd (n)."""
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{fmt.format(statistics.fmean(values))} ± {fmt.format(sd)} ({len(values)})"


def format_runs(runs: list[DistillRun]) -> str:
    lines = [
        "| run | steps | sparse tokens / step: mean (min) | completion tokens / step | KV-read "
        f"after step {SETTLED_AFTER}: mean ± sd (steps) | final budgets (pages per bin) | p5 min "
        "(median) | top-K KL, first 5 -> last 5 steps | step time: median (s) | steps' sum (h) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        sparse = "-" if not r.sparse_tokens else (
            f"{statistics.fmean(r.sparse_tokens):,.0f} ({min(r.sparse_tokens):,.0f})"
        )  # fmt: skip
        kl = "-" if r.kl_first is None else f"{r.kl_first:.4f} -> {cell(r.kl_last, '{:.4f}')}"
        lines.append(
            f"| {r.name} | {r.steps} | {sparse} | {cell(mean(r.tokens), '{:,.0f}')} | "
            f"{_spread(r.kv_read)} | {' '.join(map(str, r.budgets)) or '-'} | {cell(r.p5_min)} | "
            f"{kl} | {cell(r.step_s_median, '{:.0f}')} | {r.step_h:.2f} |"
        )
    return "\n".join(lines) + "\n"


def format_arms(runs: list[DistillRun], steps: int) -> str:
    """Per arm over its finished runs: KV-read after warm-up (mean of the seeds' means, their
    range), sparse tokens per step, the KL trend, step time."""
    lines = [
        "| arm | finished seeds | KV-read after warm-up: mean (range over seeds) | sparse tokens "
        "/ step | top-K KL first 5 -> last 5 | step time, median (s) | steps' sum per run (h) |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in sorted({r.arm for r in runs}):
        done = [r for r in runs if r.arm == arm and r.steps >= steps and r.kv_read]
        if not done:
            continue
        kv = [statistics.fmean(r.kv_read) for r in done]
        kl = [r for r in done if r.kl_first is not None and r.kl_last is not None]
        trend = "-" if not kl else (
            f"{statistics.fmean(r.kl_first for r in kl if r.kl_first is not None):.4f} -> "
            f"{statistics.fmean(r.kl_last for r in kl if r.kl_last is not None):.4f}"
        )  # fmt: skip
        lines.append(
            f"| {arm} | {len(done)} | {statistics.fmean(kv):.3f} ({min(kv):.3f}-{max(kv):.3f}) | "
            f"{statistics.fmean(t for r in done for t in r.sparse_tokens):,.0f} | {trend} | "
            f"{statistics.median(r.step_s_median or 0.0 for r in done):.0f} | "
            f"{statistics.fmean(r.step_h for r in done):.2f} |"
        )
    return "\n".join(lines) + "\n"


def format_tails(runs: list[DistillRun]) -> str:
    """Paired held-out p5 per bin: the same tokens scored without and with the adapter."""
    lines = [
        "| run | budgets (pages per bin) | sampled by | bin | tokens | p5 without -> with the "
        "adapter | mean without -> with |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if r.tail is None:
            continue
        budgets = " ".join(map(str, r.tail["budgets_pages"]))
        for sampled_by in ("base", "adapter"):
            part = r.tail[f"sampled_by_{sampled_by}"]
            for base, adapted in zip(part["scored_base"], part["scored_adapter"], strict=True):
                lines.append(
                    f"| {r.name} | {budgets} | {sampled_by} | {base['start_token']}-"
                    f"{base['end_token'] - 1} | {base['count']:,} | {base['p5']:.3f} -> "
                    f"{adapted['p5']:.3f} | {base['mean']:.3f} -> {adapted['mean']:.3f} |"
                )
    return "\n".join(lines) + "\n"


def write_distill_report(docs: Path, steps: int) -> Path:
    runs = [summarize(d) for d in sorted((docs / "runs").iterdir()) if d.is_dir()]
    stamp = datetime.datetime.now().isoformat(timespec="minutes")
    block = (
        f"{TABLE_BEGIN}\nGenerated by `sparrow.experiments.distill_table` from "
        f"`docs/distill/runs/*/` on {stamp}.\n\nPer arm (runs with all {steps} steps):\n\n"
        + format_arms(runs, steps)
        + "\nPer run:\n\n"
        + format_runs(runs)
        + "\nHeld-out tail, paired (tail.json):\n\n"
        + format_tails(runs)
        + TABLE_END
    )
    readme = splice_table(docs, block, "DistillSparse study")
    print(f"table: {readme}")
    return readme


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="distill_table", description=__doc__.splitlines()[0])
    p.add_argument("docs", nargs="?", type=Path, default=REPO / "docs/distill", help="the folder")
    p.add_argument("steps", nargs="?", type=int, default=20, help="steps of a finished run")
    args = p.parse_args(argv)
    write_distill_report(args.docs, steps=args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
