"""The method's dashboard: one ordered list of panels, grouped in sections.

`sparrow-report` draws these panels as PNGs (sparrow/cli/report.py) and `sparrow-report
--wandb-workspace` builds the same panels, in the same order, as a W&B workspace
(sparrow/cli/wandb_workspace.py); the W&B logger derives the heat map's table from the panel that
names it. Nothing else lists panels: a panel added or changed here shows in both.

A panel names metrics.jsonl keys by regex. `resolve` turns a panel into the concrete keys of a
run: per-bin series (`.../binN`) are kept only for bins that decoded tokens (the bins inside the
prompt hold the schedule's floor and no acceptance), so a 32K-context run does not draw a dozen
flat lines. Every key a non-optional panel names is logged by every training run that enables
the feature it shows (evaluation, the measured speedup): tests/cli/test_dashboard.py checks them
against a real smoke run, so a renamed metric fails there.
"""

import re
from dataclasses import dataclass

TAIL, BUDGET, LEARNING, CORRECTION, COST = (
    "Tail acceptance",
    "Budget",
    "Learning",
    "Rollout correction",
    "Cost",
)
SECTIONS = (TAIL, BUDGET, LEARNING, CORRECTION, COST)
KINDS = ("line", "stacked", "heatmap", "histogram")
TAU_KEY = "controller/tau"
_BIN = re.compile(r"/bin(\d+)$")


@dataclass(frozen=True)
class Panel:
    name: str  # PNG file stem; the title is this with spaces
    section: str  # one of SECTIONS
    keys: tuple[str, ...]  # regexes over metric keys, each matching whole keys
    ylabel: str
    kind: str = "line"  # line | stacked (areas) | heatmap (bin x step) | histogram
    reference: str | None = None  # a constant drawn as a dashed reference line (tau)
    band: tuple[str, str] | None = None  # (low, high) keys drawn as a shaded interval
    faint: str | None = None  # regex: these series drawn thin and dashed (a bound beside a value)
    wandb_key: str | None = None  # the W&B-only key the panel reads there (histogram, table)
    optional: bool = False  # a feature's panel: drawn when logged, not required of a run

    def __post_init__(self):
        if self.kind not in KINDS or self.section not in SECTIONS:
            raise ValueError(f"panel {self.name}: bad kind {self.kind!r} or {self.section!r}")


_P5 = r"accept/p5/bin\d+"
PANELS = (
    Panel("p5_acceptance", TAIL, (_P5,), "p5 acceptance per bin", reference=TAU_KEY),
    Panel(
        "p5_heatmap",
        TAIL,
        (_P5,),
        "position bin",
        "heatmap",
        reference=TAU_KEY,
        wandb_key="accept/p5_heatmap",
    ),
    Panel("noise_floor", TAIL, (r"noise_floor/p5/bin\d+",), "dense-vs-dense p5", reference=TAU_KEY),
    Panel(
        "exact_vs_topk",
        TAIL,
        (_P5, r"accept_topk/p5/bin\d+"),
        "p5: exact (solid), top-K bound (dashed)",
        reference=TAU_KEY,
        faint=r"accept_topk/.*",
    ),
    Panel(
        "acceptance_histogram",
        TAIL,
        (r"accept/hist20",),
        "fraction of tokens",
        "histogram",
        wandb_key="accept/histogram",
    ),
    Panel("budget", BUDGET, (r"schedule/budget_pages/bin\d+",), "budget (pages per sequence)"),
    Panel("kv_read_ratio", BUDGET, (r"kv_read_ratio",), "pages read / dense pages"),
    Panel(
        "speedup", BUDGET, (r"speedup/predicted", r"speedup/measured"), "decode speedup vs dense"
    ),
    Panel("reward", LEARNING, (r"reward/mean", r"acc/train"), "train reward / accuracy"),
    Panel(
        "eval_accuracy",
        LEARNING,
        (r"eval/accuracy",),
        "held-out accuracy (95% CI)",
        band=("eval/accuracy_lo95", "eval/accuracy_hi95"),
    ),
    Panel("loss", LEARNING, (r"loss/loss", r"loss/pg_loss"), "loss"),
    Panel(
        "clip",
        LEARNING,
        (r"update/clip_frac_low", r"update/clip_frac_high", r"update/dual_clip_frac"),
        "fraction of tokens",
    ),
    Panel("updates_skipped", LEARNING, (r"update/skipped", r"update/no_signal"), "skipped (1)"),
    Panel(
        "correction_weights",
        CORRECTION,
        (r"correction/weight_(mean|min|max)",),
        "rollout-correction weight",
    ),
    Panel(
        "correction_fractions",
        CORRECTION,
        (r"correction/(truncated|masked)_frac",),
        "fraction of tokens",
    ),
    Panel("mismatch_kl", CORRECTION, (r"mismatch/k3/bin\d+",), "k3 KL(rollout || dense) per bin"),
    Panel(
        "mismatch",
        CORRECTION,
        (r"mismatch/(k1|k3|ppl_ratio)", r"mismatch/ratio_(max|min)"),
        "rollout vs dense: KL, ppl ratio, extreme ratios",
    ),
    Panel(
        "dynamic_sampling",
        CORRECTION,
        (r"sampling/groups_(drawn|kept|dropped)", r"sampling/rounds", r"sampling/round_limit_hit"),
        "groups per step",
        optional=True,
    ),
    Panel("time_split", COST, (r"time/(?!step_s$)\w+_s",), "seconds per step", "stacked"),
    Panel("throughput", COST, (r"throughput/\w+_tok_s",), "tokens / s"),
)


def bin_index(key: str) -> int | None:
    match = _BIN.search(key)
    return None if match is None else int(match.group(1))


def decoded_bins(rows: list[dict]) -> set[int] | None:
    """The position bins in which some step decoded tokens (`accept/count/binN` > 0); None when
    the run logged no acceptance (a dense run), so that nothing is filtered."""
    counts = [(k, v) for r in rows for k, v in r.items() if k.startswith("accept/count/bin")]
    if not counts:
        return None
    return {
        b
        for k, v in counts
        if isinstance(v, (int, float)) and v > 0 and (b := bin_index(k)) is not None
    }


def matches(pattern: str, key: str) -> bool:
    return re.fullmatch(pattern, key) is not None


def resolve(panel: Panel, keys, bins: set[int] | None) -> list[str]:
    """The keys of `keys` the panel draws, in its patterns' order then natural order; per-bin
    keys only for `bins` (None: all)."""
    out: list[str] = []
    for pattern in panel.keys:
        found = [k for k in keys if matches(pattern, k) and k not in out]
        found = [k for k in found if bins is None or bin_index(k) in (bins | {None})]
        out += sorted(found, key=natural_order)
    return out


def layout(keys, bins: set[int] | None) -> list[tuple[str, list[tuple[Panel, list[str]]]]]:
    """The sections with the panels that have data among `keys`, each with its keys, in order."""
    sections = []
    for section in SECTIONS:
        panels = [(p, resolve(p, keys, bins)) for p in PANELS if p.section == section]
        panels = [(p, k) for p, k in panels if k]
        if panels:
            sections.append((section, panels))
    return sections


def natural_order(key: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key)]
