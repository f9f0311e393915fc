"""What the DistillSparse study (distill_study) keeps of its runs in DOCS/runs/<run>/, kept in git:
each run's metrics.jsonl and run_config.json, a finished base run's settled budgets and, per
finished adapter run, its offline tail (distill_tail) at the budgets the base run of its seed
settled at. A run whose files are all there is complete: a study spread over several sessions
(a fresh checkout has no run dirs) keeps its finished seeds. The table comes from these files
alone (distill_table)."""

import json
import shutil

from sparrow.cli.config_loader import load_config
from sparrow.experiments.distill_table import write_distill_report
from sparrow.experiments.distill_tail import offline_tail, settled_budgets
from sparrow.experiments.study import Invocation
from sparrow.experiments.study_files import rows_by_step
from sparrow.experiments.study_runs import StudyRun, final_checkpoint

COPIED = ("metrics.jsonl", "run_config.json")
BUDGETS = "settled_budgets.json"  # a base run's final schedule, for its seed's adapter tail


def archived(inv: Invocation, run: StudyRun, steps: int) -> str | None:
    """DOCS/runs/<run> when it holds the run's every step (and an adapter run's tail), else None."""
    folder = inv.docs / "runs" / run.name
    if len([s for s in rows_by_step(folder) if s > 0]) < steps:
        return None
    tail_missing = inv.args.tail_prompts and not (folder / "tail.json").is_file()
    return None if run.name.startswith("adapter_") and tail_missing else str(folder)


def archive_and_report(inv: Invocation, steps: dict[str, int]) -> None:
    """Copy the runs' files into DOCS/runs/, add the missing tails, write the table."""
    for run in inv.runs:
        target = inv.docs / "runs" / run.name
        for name in COPIED:
            if (inv.root / run.name / name).is_file():
                target.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(inv.root / run.name / name, target / name)
        if run.name.startswith("base_") and final_checkpoint(inv.root / run.name, steps[run.name]):
            budgets = {"budgets_pages": settled_budgets(inv.root / run.name)}
            (target / BUDGETS).write_text(json.dumps(budgets) + "\n")
    for run in inv.runs:
        if inv.args.tail_prompts and run.name.startswith("adapter_"):
            tail_of(inv, run, steps)
    write_distill_report(inv.docs, max(steps.values()))


def tail_of(inv: Invocation, run: StudyRun, steps: dict[str, int]) -> None:
    """The offline tail of a finished adapter run at its seed's base-run budgets, once."""
    out = inv.docs / "runs" / run.name / "tail.json"
    base = "base_" + run.name.split("_", 1)[1]
    if out.is_file():
        return
    budgets = base_budgets(inv, base, steps.get(base, steps[run.name]))
    if final_checkpoint(inv.root / run.name, steps[run.name]) is None or budgets is None:
        print(f"distill_study: no tail for {run.name} yet ({run.name} and {base} must finish)")
        return
    print(f"distill_study: offline tail of {run.name} at {base}'s budgets {budgets}", flush=True)
    cfg = load_config([*inv.overrides, *run.overrides, f"run_dir={inv.root / run.name}"])
    args = inv.args
    tail = offline_tail(cfg, inv.root / run.name, budgets, args.tail_prompts, args.tail_samples)
    out.write_text(json.dumps({"budgets_from": base, **tail}, indent=1) + "\n")


def base_budgets(inv: Invocation, base: str, steps: int) -> list[int] | None:
    """Where the finished base run's controller settled: from its final checkpoint, or archived
    beside its metrics when it finished in an earlier checkout; None while it has not finished."""
    if final_checkpoint(inv.root / base, steps) is not None:
        return settled_budgets(inv.root / base)
    archived_budgets = inv.docs / "runs" / base / BUDGETS
    if archived_budgets.is_file():
        return json.loads(archived_budgets.read_text())["budgets_pages"]
    return None
