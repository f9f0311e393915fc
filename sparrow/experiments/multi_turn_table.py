"""The multi-turn study's report (sparrow.experiments.multi_turn_study): each run's metrics.jsonl
copied into docs/multi_turn/runs/<run>/, then from those copies alone: per step and arm (mean over
the seeds logged) the tool calls and turns per episode, the reward and the held-out accuracy; per
run the held-out accuracy before and after and the KV-read ratio per assistant turn. A run not
logged yet is a row marked missing."""

import datetime
import re
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
from sparrow.experiments.table_cells import Interval, cell, ci_cell, finite_values, mean

# What the per-step table shows: (column, metrics key).
STEP_FIGURES = (
    ("tool calls / episode", "episode/tool_calls_mean"),
    ("turns / episode", "episode/turns_mean"),
    ("reward", "reward/mean"),
    ("held-out accuracy", "eval/accuracy"),
)
TURN_KEY = re.compile(r"^kv_read_ratio/turn(\d+)$")


@dataclass(frozen=True)
class MultiTurnRun:
    name: str
    arm: str
    steps_logged: int
    steps_total: int
    rows: dict[int, dict]  # metrics rows by step (0: the evaluation before training)
    before: Interval | None  # held-out accuracy at step 0
    after: Interval | None  # at the last evaluation after step 0
    kv_read: float | None  # mean over steps of the step's KV-read ratio (all turns)
    kv_read_by_turn: dict[int, float]  # turn -> mean over the steps that reached it
    train_min: float  # minutes in training steps (time/step_s summed)


def summarize_run(runs_dir: Path, name: str, steps: int) -> MultiTurnRun:
    rows = rows_by_step(runs_dir / name) if (runs_dir / name / "metrics.jsonl").is_file() else {}
    evals = [rows[s] for s in sorted(rows) if "eval/accuracy" in rows[s]]
    train = [r for s, r in sorted(rows.items()) if s > 0 and "reward/mean" in r]
    turns = sorted({int(m[1]) for r in train for k in r if (m := TURN_KEY.match(k))})
    by_turn = {t: mean(finite_values(train, f"kv_read_ratio/turn{t}")) for t in turns}
    return MultiTurnRun(
        name=name,
        arm=name.rsplit("_s", 1)[0],
        steps_logged=max((s for s in rows if s > 0), default=0),
        steps_total=steps,
        rows=rows,
        before=_accuracy(evals[0]) if evals and evals[0]["step"] == 0 else None,
        after=_accuracy(evals[-1]) if evals and evals[-1]["step"] > 0 else None,
        kv_read=mean(finite_values(train, "kv_read_ratio")),
        kv_read_by_turn={t: v for t, v in by_turn.items() if v is not None},
        train_min=sum(finite_values(train, "time/step_s")) / 60,
    )


def _accuracy(row: dict) -> Interval:
    """Held-out accuracy with its Wilson interval (eval/accuracy_lo95 and _hi95, as logged)."""
    return row["eval/accuracy"], row["eval/accuracy_lo95"], row["eval/accuracy_hi95"]


def format_steps(runs: list[MultiTurnRun]) -> str:
    """A row per (step, arm): each figure's mean over the arm's seeds that logged the step."""
    head = " | ".join(column for column, _ in STEP_FIGURES)
    lines = [f"| step | arm | seeds | {head} |", "|---" * (3 + len(STEP_FIGURES)) + "|"]
    by_arm: dict[str, list[MultiTurnRun]] = defaultdict(list)
    for r in runs:
        by_arm[r.arm].append(r)
    steps = sorted({s for r in runs for s in r.rows})
    for step in steps:
        for arm, arm_runs in by_arm.items():
            rows = [r.rows[step] for r in arm_runs if step in r.rows]
            if not rows:
                continue
            cells = [cell(mean(finite_values(rows, key)), "{:.3f}") for _, key in STEP_FIGURES]
            lines.append(f"| {step} | {arm} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def format_runs(runs: list[MultiTurnRun]) -> str:
    turns = sorted({t for r in runs for t in r.kv_read_by_turn})
    turn_head = "".join(f" KV-read turn {t} |" for t in turns)
    lines = [
        "| run | steps | held-out before (95% CI) | after (95% CI) | KV-read |"
        + turn_head
        + " train min |",
        "|---" * (6 + len(turns)) + "|",
    ]
    for r in runs:
        if not r.rows:
            lines.append(f"| {r.name} | missing (0/{r.steps_total}) |" + " - |" * (4 + len(turns)))
            continue
        per_turn = "".join(f" {cell(r.kv_read_by_turn.get(t), '{:.3f}')} |" for t in turns)
        lines.append(
            f"| {r.name} | {r.steps_logged}/{r.steps_total} | {ci_cell(r.before)} | "
            f"{ci_cell(r.after)} | {cell(r.kv_read, '{:.3f}')} |{per_turn} {r.train_min:.1f} |"
        )
    return "\n".join(lines) + "\n"


def format_arms(runs: list[MultiTurnRun]) -> str:
    """Per arm over its finished runs: held-out accuracy before and after (means), the reward of
    the first and last steps, and the KV-read ratio per turn (mean over runs)."""
    turns = sorted({t for r in runs for t in r.kv_read_by_turn})
    lines = [
        "| arm | finished seeds | held-out before | after | reward, first step | last step |"
        + "".join(f" KV-read turn {t} |" for t in turns),
        "|---" * (6 + len(turns)) + "|",
    ]
    by_arm: dict[str, list[MultiTurnRun]] = defaultdict(list)
    for r in runs:
        by_arm[r.arm].append(r)
    for arm, arm_runs in by_arm.items():
        done = [r for r in arm_runs if r.rows and r.steps_logged == r.steps_total]
        first = [r.rows[1]["reward/mean"] for r in done if "reward/mean" in r.rows.get(1, {})]
        last = [r.rows[r.steps_total]["reward/mean"] for r in done]
        per_turn = "".join(
            f" {cell(mean([r.kv_read_by_turn[t] for r in done if t in r.kv_read_by_turn]))} |"
            for t in turns
        )
        lines.append(
            f"| {arm} | {len(done)} of {len(arm_runs)} | "
            f"{cell(mean([r.before[0] for r in done if r.before]))} | "
            f"{cell(mean([r.after[0] for r in done if r.after]))} | "
            f"{cell(mean(first))} | {cell(mean(last))} |{per_turn}"
        )
    return "\n".join(lines) + "\n"


def write_multi_turn_report(root: Path, runs: list, steps: dict, docs: Path) -> Path:
    """Copy what ROOT holds into DOCS/runs, then the tables from DOCS/runs alone."""
    names = [r.name for r in runs]
    copy_metrics(root, names, docs)
    summaries = [summarize_run(docs / "runs", n, steps[n]) for n in names]
    stamp = datetime.datetime.now().isoformat(timespec="minutes")
    block = (
        f"{TABLE_BEGIN}\nGenerated by `python -m sparrow.experiments.multi_turn_study --report` "
        f"from `docs/multi_turn/runs/*/metrics.jsonl` on {stamp}.\n\n"
        "Per arm (finished runs, means over seeds):\n\n"
        + format_arms(summaries)
        + "\nPer run:\n\n"
        + format_runs(summaries)
        + "\nPer step (mean over the seeds that logged it; step 0 is the evaluation before "
        "training):\n\n" + format_steps(summaries) + TABLE_END
    )
    readme = splice_table(docs, block, "Multi-turn tool use: sparse vs dense rollouts")
    print(f"table: {readme}")
    return readme
