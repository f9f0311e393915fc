"""What a newcomer's `make train` gives: the default run's held-out result over the committed runs
of its config (seeds and hosts), the claim a run on any host is held to, and the host check.

A seeded run repeats to the byte on one host and parts from step 1 on another (oneDNN and MKL
choose kernels by the CPU's instruction sets, each sums in its own order, and sampling turns
those last-bit differences into other tokens within a few steps: sparrow/train/run/host.py). So
the README states the spread over runs, and tests/experiments/test_default_run.py holds a fresh
run to exactness only on the host that wrote docs/default_run (its host.json equals this
host's fingerprint), and elsewhere to `claim_failures`: its paired gain's 95% CI above 0 and its
final accuracy's 95% CI meeting the range of the runs below.

Runs of `make train`'s config alone count: `sparrow-train` with no override but `seed` (and the
run dir, logging, the progress bar). docs/pipeline's `sync_s*` are that (its sync arm sets
`rl.async.staleness=0`, the default; `sync_s0` equals docs/default_run in all 1,192 non-timing
values); its `async1`, `rollout1` and `twins/` runs train on stale rows (staleness 1) and do not.
"""

import statistics
from dataclasses import dataclass
from pathlib import Path

from sparrow.train.logs.metrics_logger import read_metrics
from sparrow.train.run.host import describe, run_host

REPO = Path(__file__).resolve().parents[2]
SPREAD_BEGIN, SPREAD_END = "<!-- default-run-spread:begin -->", "<!-- default-run-spread:end -->"
# Runs from before host.json name their host by what is known of it.
UNRECORDED = {
    "A": "the host of docs/default_run and of the pipeline study's runs at 67bd543 (no host.json: "
    "they predate it; the same host, since sync_s0 repeats docs/default_run to the byte)",
}


@dataclass(frozen=True)
class SpreadRun:
    path: str  # the run's folder under the repo: metrics.jsonl, and host.json when recorded
    seed: int
    host: str  # a label; runs that share it ran on one host (their host.json, if any, agree)
    commit: str
    date: str


SPREAD = (
    SpreadRun("docs/default_run", 0, "A", "bc9d996", "2026-12-04"),
    SpreadRun("docs/pipeline/runs/sync_s1", 1, "A", "67bd543", "2026-12-05"),
    SpreadRun("docs/pipeline/runs/sync_s2", 2, "A", "67bd543", "2026-12-05"),
    SpreadRun("docs/default_run/spread/b_s0", 0, "B", "ce251de", "2026-12-06"),
)


@dataclass(frozen=True)
class Outcome:
    run: SpreadRun
    steps: int  # the last step logged (a step whose update was skipped for want of signal counts)
    eval_n: int  # held-out prompts
    before: float
    after: float
    after_lo: float  # the final accuracy's 95% CI
    after_hi: float
    gain: float  # paired, after - before, with its 95% CI
    gain_lo: float
    gain_hi: float


@dataclass(frozen=True)
class Spread:
    outcomes: list[Outcome]
    hosts: dict[str, str]  # label -> what is known of the host

    @property
    def after(self) -> tuple[float, float]:
        values = [o.after for o in self.outcomes]
        return min(values), max(values)

    @property
    def gain(self) -> tuple[float, float, float]:
        """(mean, min, max) of the paired gain over the runs."""
        values = [o.gain for o in self.outcomes]
        return statistics.fmean(values), min(values), max(values)


def outcome(run: SpreadRun, rows: list[dict]) -> Outcome:
    evals = [r for r in rows if "eval/accuracy" in r]
    first, last = evals[0], evals[-1]
    return Outcome(
        run=run,
        steps=max(r["step"] for r in rows),
        eval_n=int(last["eval/n"]),
        before=first["eval/accuracy"],
        after=last["eval/accuracy"],
        after_lo=last["eval/accuracy_lo95"],
        after_hi=last["eval/accuracy_hi95"],
        gain=last["eval/delta"],
        gain_lo=last["eval/delta_lo95"],
        gain_hi=last["eval/delta_hi95"],
    )


def read_spread(runs: tuple[SpreadRun, ...] = SPREAD, repo: Path = REPO) -> Spread:
    """The runs' outcomes and their hosts; ValueError when two runs labelled one host carry
    different host.json fingerprints, or two labels the same one."""
    prints: dict[str, dict] = {}
    for run in runs:
        found = run_host(repo / run.path)
        if found is None:
            continue
        if prints.setdefault(run.host, found) != found:
            raise ValueError(f"{run.path}: host {run.host}'s runs carry different host.json")
    labels = list(prints)
    if any(prints[a] == prints[b] for a in labels for b in labels if a < b):
        raise ValueError("two host labels carry one fingerprint")
    hosts = {run.host: UNRECORDED.get(run.host, "?") for run in runs}
    hosts |= {label: describe(fp) for label, fp in prints.items()}
    return Spread([outcome(r, read_metrics(repo / r.path)) for r in runs], hosts)


def claim_failures(run: Outcome, spread: Spread) -> list[str]:
    """What a run of `make train`'s config on another host must show: it learns (the paired
    gain's 95% CI above 0) as the committed runs did (its final accuracy's 95% CI meets their
    range: the range itself would refuse a run drawn from the same spread too often at n = 200).
    Empty when it does."""
    failures = []
    if not run.gain_lo > 0:
        failures.append(
            f"gain {run.gain:+.3f}: its 95% CI, from {run.gain_lo:+.3f}, does not lie above 0"
        )
    lo, hi = spread.after
    if run.after_hi < lo or run.after_lo > hi:
        failures.append(
            f"final accuracy {run.after:.3f} (95% CI {run.after_lo:.3f} to {run.after_hi:.3f}) "
            f"misses the stated spread {lo:.3f} to {hi:.3f}"
        )
    return failures


def _hosts_phrase(spread: Spread) -> str:
    seeds: dict[str, list[int]] = {}
    for o in spread.outcomes:
        seeds.setdefault(o.run.host, []).append(o.run.seed)
    per_host = "; ".join(
        f"host {h}: seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))}"
        for h, s in seeds.items()
    )
    return f"{len(spread.outcomes)} runs on {len(seeds)} hosts ({per_host})"


WHY = (
    "a run repeats to the byte on one host and parts from step 1 on another: oneDNN and MKL pick "
    "kernels by the CPU's instruction sets, each sums in its own order, and sampling turns the "
    "last-bit differences into other tokens"
)


def format_value(spread: Spread) -> str:
    """The held-out part of the README's row."""
    mean, lo, hi = spread.gain
    after_lo, after_hi = spread.after
    above = sum(o.gain_lo > 0 for o in spread.outcomes)
    before = sorted({f"{o.before:.3f}" for o in spread.outcomes})
    half = statistics.fmean((o.after_hi - o.after_lo) / 2 for o in spread.outcomes)
    return (
        f"{'/'.join(before)} -> {after_lo:.3f} to {after_hi:.3f}, paired gain **{mean:+.3f}** "
        f"({lo:+.3f} to {hi:+.3f}; 95% CI above 0 in {above} of {len(spread.outcomes)}) over "
        f"{_hosts_phrase(spread)}; a newcomer's run is held to land within its own 95% CI "
        f"(about +-{half:.3f} at n = {spread.outcomes[0].eval_n}) of that range; {WHY}"
    )


def format_table(spread: Spread) -> str:
    """docs/default_run/README.md's spread section: one row per run, then the hosts."""
    head = (
        "| run | seed | host | commit | date | held-out before | after (95% CI) | "
        "gain (paired 95% CI) |\n|---|---|---|---|---|---|---|---|\n"
    )
    rows = "".join(
        f"| `{o.run.path}` | {o.run.seed} | {o.run.host} | {o.run.commit} | {o.run.date} | "
        f"{o.before:.3f} | {o.after:.3f} ({o.after_lo:.3f} to {o.after_hi:.3f}) | "
        f"{o.gain:+.3f} ({o.gain_lo:+.3f} to {o.gain_hi:+.3f}) |\n"
        for o in spread.outcomes
    )
    mean, lo, hi = spread.gain
    after_lo, after_hi = spread.after
    summary = (
        f"\nOver {_hosts_phrase(spread)}: final accuracy {after_lo:.3f} to {after_hi:.3f}, "
        f"gain {mean:+.3f} ({lo:+.3f} to {hi:+.3f}).\n\n"
    )
    hosts = "".join(f"- host {label}: {what}\n" for label, what in spread.hosts.items())
    return head + rows + summary + hosts
