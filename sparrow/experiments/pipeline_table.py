"""The staleness parity study's report (sparrow.experiments.pipeline_study): each run's
metrics.jsonl copied into docs/pipeline/runs/<run>/, then a row per run, a row per arm, the
per-seed difference of the held-out gain between the arms, and the sentence the runs support,
read from those copies alone and written between the study-table markers of
docs/pipeline/README.md."""

import datetime
import re
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
    finite_values,
    interval,
    mean,
    median,
)

BASE, STALE = "sync", "async1"  # the arms compared (pipeline_study.ARMS)
SPLIT = "rollout1"  # draws what async1 draws: a seed of it repeats async1's run on one host
# What two runs of one computation may differ in: times, rates, the push only a split logs, and
# the phases' measured memory (memory/peak_gib/<phase>).
_TIMING = re.compile(
    r"^time/|_s$|tok_s|/tokens_per_s|^speedup/measured$|^sync/push_bytes$|^memory/"
)


@dataclass(frozen=True)
class PipelineRun:
    name: str
    arm: str
    seed: str
    steps_logged: int
    steps_total: int
    before: float | None  # held-out accuracy at step 0
    after: Interval | None  # at the last evaluation (Wilson interval, as logged)
    gain: Interval | None  # after - before on the same prompts (paired interval, as logged)
    staleness: float  # async/staleness (weight versions behind) averaged over the steps
    p5_min: float | None  # median over steps of the step's lowest per-bin p5 acceptance
    kv_read: float | None  # mean KV-read ratio over steps
    step_s: float | None  # mean step seconds (the trainer's clock)

    @property
    def finished(self) -> bool:
        return self.steps_logged == self.steps_total and self.gain is not None


def summarize_run(runs_dir: Path, name: str, steps: int) -> PipelineRun:
    rows = rows_by_step(runs_dir / name)
    evals = [rows[s] for s in sorted(rows) if "eval/accuracy" in rows[s]]
    train = [r for s, r in sorted(rows.items()) if s > 0 and "reward/mean" in r]
    last = evals[-1] if len(evals) > 1 else {}
    arm, seed = name.rsplit("_s", 1)
    return PipelineRun(
        name=name,
        arm=arm,
        seed=seed,
        steps_logged=max((s for s in rows if s > 0), default=0),
        steps_total=steps,
        before=evals[0]["eval/accuracy"] if evals else None,
        after=interval(last, "eval/accuracy"),
        gain=interval(last, "eval/delta"),
        staleness=mean(finite_values(train, "async/staleness")) or 0.0,
        p5_min=median(finite_values(train, "accept/p5_min")),
        kv_read=mean(finite_values(train, "kv_read_ratio")),
        step_s=mean(finite_values(train, "time/step_s")),
    )


def _spread(values: list[float], fmt: str = "{:+.3f}") -> str:
    avg, lo, hi = statistics.fmean(values), min(values), max(values)
    return f"{fmt.format(avg)} ({fmt.format(lo)} to {fmt.format(hi)})"


def format_runs(runs: list[PipelineRun]) -> str:
    lines = [
        "| run | steps | held-out before | after (95% CI) | gain (paired 95% CI) | staleness "
        "| p5 min (median) | KV-read | step s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r.name} | {r.steps_logged}/{r.steps_total} | {cell(r.before)} "
            f"| {ci_cell(r.after)} "
            f"| {ci_cell(r.gain, '{:+.3f}')} | {r.staleness:.2f} | {cell(r.p5_min)} "
            f"| {cell(r.kv_read, '{:.2f}')} | {cell(r.step_s, '{:.1f}')} |"
        )
    return "\n".join(lines) + "\n"


def gains_by_arm(runs: list[PipelineRun]) -> dict[str, dict[str, PipelineRun]]:
    """arm -> seed -> finished run."""
    out: dict[str, dict[str, PipelineRun]] = defaultdict(dict)
    for r in runs:
        if r.finished:
            out[r.arm][r.seed] = r
    return out


def format_arms(runs: list[PipelineRun]) -> str:
    """Per arm over its finished runs: the mean gain and its range over seeds, and how many
    runs' paired interval lies above 0."""
    lines = [
        "| arm | seeds | gain: mean (range over seeds) | runs with the gain's CI above 0 |",
        "|---|---|---|---|",
    ]
    for arm, done in gains_by_arm(runs).items():
        gains = [r.gain for r in done.values() if r.gain is not None]
        above = sum(1 for g in gains if g[1] > 0)
        lines.append(
            f"| {arm} | {len(gains)} | {_spread([g[0] for g in gains])} | {above}/{len(gains)} |"
        )
    return "\n".join(lines) + "\n"


def sentence(runs: list[PipelineRun]) -> str:
    """What the finished runs support, in one sentence (regenerated with the table)."""
    arms = gains_by_arm(runs)
    base, stale = arms.get(BASE, {}), arms.get(STALE, {})
    seeds = sorted(set(base) & set(stale))
    if not seeds:
        return "No seed has both arms finished yet: the study supports no sentence so far."

    def gain(run: PipelineRun) -> float:
        assert run.gain is not None  # finished runs have one
        return run.gain[0]

    diffs = [gain(stale[s]) - gain(base[s]) for s in seeds]
    above = sum(1 for s in seeds if (g := stale[s].gain) is not None and g[1] > 0)
    return (
        f"Over {len(seeds)} seed(s), staleness 1 gains {_spread([gain(stale[s]) for s in seeds])} "
        f"held-out accuracy against {_spread([gain(base[s]) for s in seeds])} for the "
        f"synchronous loop; the per-seed difference (staleness 1 - 0, same prompts) is "
        f"{_spread(diffs)}, and the gain's paired 95% interval lies above 0 in {above} of "
        f"{len(seeds)} staleness-1 run(s)."
    )


def write_pipeline_report(root: Path, runs: list, steps: dict, docs: Path) -> Path:
    """Copy what ROOT holds into DOCS/runs, then the table from DOCS/runs alone."""
    names = [r.name for r in runs]
    copy_metrics(root, names, docs)
    summaries = [summarize_run(docs / "runs", n, steps[n]) for n in names]
    stamp = datetime.datetime.now().isoformat(timespec="minutes")
    block = (
        f"{TABLE_BEGIN}\nGenerated by `python -m sparrow.experiments.pipeline_study --report` "
        f"from `docs/pipeline/runs/*/metrics.jsonl` (and `twins/`) on {stamp}.\n\n"
        f"{sentence(summaries)}\n\n"
        "Per arm (finished runs):\n\n"
        + format_arms(summaries)
        + "\nPer run:\n\n"
        + format_runs(summaries)
        + format_twins(docs, names)
        + TABLE_END
    )
    readme = splice_table(docs, block, "Staleness parity: one-step-off vs synchronous GRPO")
    print(f"table: {readme}")
    return readme


def differing_values(a: dict, b: dict) -> tuple[int, int]:
    """(values compared, values that differ) between two runs' rows by step, timings and the
    push aside."""
    compared = differ = 0
    for step in sorted(set(a) | set(b)):
        ra, rb = a.get(step, {}), b.get(step, {})
        for key in set(ra) | set(rb):
            if not _TIMING.search(key):
                compared += 1
                differ += ra.get(key) != rb.get(key)
    return compared, differ


def format_twins(docs: Path, names: list[str]) -> str:
    """Each finished split run against the async1 run of its seed from the same host: the one in
    DOCS/twins/ when there is one (a run made beside it on another host than runs/), else runs/."""
    lines = []
    for name in names:
        seed = name.rsplit("_s", 1)[1]
        if not name.startswith(SPLIT + "_s") or not (docs / "runs" / name).is_dir():
            continue
        twin = f"{STALE}_s{seed}"
        where = "twins" if (docs / "twins" / twin).is_dir() else "runs"
        if not (docs / where / twin).is_dir():
            continue
        compared, differ = differing_values(
            rows_by_step(docs / "runs" / name), rows_by_step(docs / where / twin)
        )
        lines.append(f"| {name} | {where}/{twin} | {compared} | {differ} |")
    if not lines:
        return ""
    head = "| split run | its one-process twin | non-timing values | differ |\n|---|---|---|---|\n"
    return (
        "\nThe split layout against one process, same seed, same host:\n\n"
        + head
        + ("\n".join(lines) + "\n")
    )
