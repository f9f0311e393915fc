"""The default run's report (`make train`: `sparrow-train` on its embedded CPU default): the
table of docs/default_run/README.md from docs/default_run/metrics.jsonl, its spread section and
the README's results row from that run and the other committed runs of its config
(default_run_spread.py: seeds and hosts), each written between its markers. All are generated,
so none can drift from the runs committed beside them.

    python -m sparrow.experiments.default_run_report           # rewrite both from the metrics
    python -m sparrow.experiments.default_run_report --check   # exit 1 if either is stale

The non-timing values of the committed metrics are what the code gives on the host that ran it
(the run is seeded; another host's CPU rounds otherwise): tests/experiments/test_default_run.py
reruns the first steps there and the whole run, held to the spread, elsewhere.
"""

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from sparrow.experiments import default_run_spread as spread_runs
from sparrow.train.logs.metrics_logger import read_metrics

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "default_run"
TABLE_BEGIN, TABLE_END = "<!-- default-run:begin -->", "<!-- default-run:end -->"
ROW_PREFIX = "| default run ("  # the README's results row (a comment would end the table)
SETTLED_AFTER = 3  # steps the controller takes to raise its start budget: out of the means
MIN_BIN_TOKENS = 50  # a bin's p5 counts towards the tail figure when it pooled this many tokens
TAU_SLACK = 0.02  # "holds the tail": p5 >= tau - this in every such bin


@dataclass(frozen=True)
class DefaultRun:
    steps: int
    acc_before: float  # held-out greedy accuracy before training
    acc_after: float
    eval_n: int
    delta: float  # paired, after - before, with its 95% CI
    delta_lo: float
    delta_hi: float
    kv_read: list[float]  # per step after SETTLED_AFTER
    tail_held: list[bool]  # per step after SETTLED_AFTER: p5 >= tau - TAU_SLACK in every bin
    p5_min: list[float]  # per step after SETTLED_AFTER: the smallest per-bin p5 of those bins
    tau: float
    completion_bin: int  # the bin holding the first completion tokens
    completion_budgets: list[int]  # its budget (pages) after each step
    truncated: list[float]  # per step: the TIS-truncated token share
    speedup: list[tuple[int, float, float]]  # (step, measured, predicted) where measured
    rollout_tok_s: list[float]
    step_s: float  # the steps' time on the trainer's clock (evaluations not included)


def _bin(key: str) -> int:
    return int(key.rsplit("bin", 1)[1])


def _tail_bins(row: dict) -> dict[int, float]:
    """bin -> p5 for the bins that pooled >= MIN_BIN_TOKENS tokens this step."""
    counts = {_bin(k): v for k, v in row.items() if k.startswith("accept/count/bin")}
    return {b: row[f"accept/p5/bin{b}"] for b, n in counts.items() if n >= MIN_BIN_TOKENS}


def summarize(rows: list[dict]) -> DefaultRun:
    evals = [r for r in rows if "eval/accuracy" in r]
    first, last = evals[0], evals[-1]
    train = [r for r in rows if "loss/loss" in r]
    settled = [r for r in train if r["step"] > SETTLED_AFTER]
    tau = train[0]["controller/tau"]
    tails = [_tail_bins(r) for r in settled]
    # The first bin the monitor pooled tokens in: where the completions start.
    completion_bin = min(_bin(k) for k in train[0] if k.startswith("accept/count/bin"))
    return DefaultRun(
        steps=len(train),
        acc_before=first["eval/accuracy"],
        acc_after=last["eval/accuracy"],
        eval_n=int(last["eval/n"]),
        delta=last["eval/delta"],
        delta_lo=last["eval/delta_lo95"],
        delta_hi=last["eval/delta_hi95"],
        kv_read=[r["kv_read_ratio"] for r in settled],
        tail_held=[all(p >= tau - TAU_SLACK for p in t.values()) for t in tails],
        p5_min=[min(t.values()) for t in tails],
        tau=tau,
        completion_bin=completion_bin,
        completion_budgets=[int(r[f"schedule/budget_pages/bin{completion_bin}"]) for r in train],
        truncated=[r["correction/truncated_frac"] for r in train],
        speedup=[
            (r["step"], r["speedup/measured"], r["speedup/predicted"])
            for r in train
            if "speedup/measured" in r
        ],
        rollout_tok_s=[r["throughput/rollout_tok_s"] for r in train],
        step_s=sum(r["time/step_s"] for r in train),
    )


def _range(values: list[float], fmt: str) -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def format_table(run: DefaultRun) -> str:
    after = f"steps {SETTLED_AFTER + 1}-{run.steps}"
    speedups = ", ".join(f"{m:.2f}x" for _, m, _ in run.speedup)
    predicted = ", ".join(f"{p:.2f}x" for _, _, p in run.speedup)
    at = ", ".join(str(s) for s, _, _ in run.speedup)
    rows = [
        (
            f"held-out greedy accuracy, n = {run.eval_n}",
            f"{run.acc_before:.3f} -> **{run.acc_after:.3f}** (paired {run.delta:+.3f}, "
            f"95% CI {run.delta_lo:+.3f} to {run.delta_hi:+.3f})",
        ),
        (
            f"mean KV-read ratio, {after}",
            f"**{statistics.fmean(run.kv_read):.3f}** (per step {_range(run.kv_read, '.2f')}; "
            "the dense noise-floor prompt is counted)",
        ),
        (
            f"p5 >= tau - {TAU_SLACK} in every bin with >= {MIN_BIN_TOKENS} tokens, {after}",
            f"**{sum(run.tail_held)} of {len(run.tail_held)} steps** (smallest bin p5 per step "
            f"{_range(run.p5_min, '.3f')}; tau {run.tau:.2f})",
        ),
        (
            f"budget (pages) of the completion bin (bin {run.completion_bin}) after each step",
            ", ".join(str(b) for b in run.completion_budgets),
        ),
        ("TIS-truncated token share per step", _range(run.truncated, ".4f")),
        (
            f"rollout speedup, timed dense re-rollout (steps {at})",
            f"{speedups} (cost model: {predicted})" if run.speedup else "not measured",
        ),
        ("rollout tokens/s", _range(run.rollout_tok_s, ".0f")),
        (f"the {run.steps} steps on the trainer's clock", _minutes(run.step_s)),
    ]
    return "| | |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)


def format_row(run: DefaultRun, spread: spread_runs.Spread) -> str:
    """The README's results row (its columns: figure, value, command, commit, date, study): the
    held-out result over the spread's runs; the controller's figures of the committed run."""
    figure = (
        f"{ROW_PREFIX[2:]}{run.steps} steps, n = {run.eval_n}): held-out accuracy over the "
        f"committed runs; the committed run's (seed 0, host A) KV-read ratio and p5 after step "
        f"{SETTLED_AFTER}"
    )
    kv_read = statistics.fmean(run.kv_read)
    value = (
        f"{spread_runs.format_value(spread)}. Committed run: {run.acc_before:.3f} -> "
        f"{run.acc_after:.3f} (paired {run.delta:+.3f}, 95% CI {run.delta_lo:+.3f} to "
        f"{run.delta_hi:+.3f}); KV-read **{kv_read:.3f}**, p5 >= {run.tau - TAU_SLACK:.2f} at "
        f"{sum(run.tail_held)} of {len(run.tail_held)} steps"
    )
    commits = ", ".join(dict.fromkeys(o.run.commit for o in spread.outcomes))
    dates = sorted(o.run.date for o in spread.outcomes)
    date = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    study = "[docs/default_run/](docs/default_run/)"
    return f"| {figure} | {value} | `make train` | {commits} | {date} | {study} |"


def replace_row(text: str, row: str) -> str:
    """`text` with its one line that starts with ROW_PREFIX replaced by `row`."""
    lines = text.split("\n")
    at = [i for i, line in enumerate(lines) if line.startswith(ROW_PREFIX)]
    if len(at) != 1:
        raise ValueError(f"expected one README line starting {ROW_PREFIX!r}, found {len(at)}")
    lines[at[0]] = row
    return "\n".join(lines)


def splice(text: str, begin: str, end: str, body: str) -> str:
    """`text` with what stands between the marker lines `begin` and `end` replaced by `body`."""
    if begin not in text or end not in text:
        raise ValueError(f"markers {begin} / {end} not found")
    before, rest = text.split(begin, 1)
    return f"{before}{begin}\n{body}{end}{rest.split(end, 1)[1]}"


def regenerate(
    docs: Path = DOCS,
    readme: Path = REPO / "README.md",
    spread: spread_runs.Spread | None = None,
) -> dict[Path, str]:
    """The two files' texts with the run's table, the spread and the row rewritten (not
    written); `spread` defaults to the committed runs (default_run_spread.SPREAD)."""
    run = summarize(read_metrics(docs))
    spread = spread or spread_runs.read_spread()
    study = docs / "README.md"
    text = splice(study.read_text(), TABLE_BEGIN, TABLE_END, format_table(run))
    begin, end = spread_runs.SPREAD_BEGIN, spread_runs.SPREAD_END
    text = splice(text, begin, end, spread_runs.format_table(spread))
    return {study: text, readme: replace_row(readme.read_text(), format_row(run, spread))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in regenerate().items():
        if path.read_text() != text:
            stale.append(path)
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(map(str, stale))}", file=sys.stderr)
        return 1
    print("up to date" if not stale else f"rewrote {', '.join(map(str, stale))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
