"""A study, declared: its arms, the seeds each arm runs with, the overrides every run shares and
the report written from the runs (`Study`). `study_main` is every study's command: the same flags,
Hydra overrides after `--`, and --status, --report and --background; the runs themselves are
`sparrow-train` processes (study_runs.py)."""

import argparse
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparrow.cli.config_loader import ConfigError
from sparrow.cli.errors import at_least
from sparrow.experiments.study_files import REPO, rows_by_step, run_wall_s
from sparrow.experiments.study_runs import (
    StudyRun,
    final_checkpoint,
    record_status,
    run_all,
    total_steps,
)


@dataclass(frozen=True)
class Arm:
    """One setting the study compares: a run per seed (`<arm>_s<seed>`), or one run (`<arm>`)."""

    name: str
    overrides: tuple[str, ...]  # Hydra overrides on top of the shared ones
    setting: str  # one line for the table
    flag: str | None = None  # an extra arm: run only with --<flag>, or when --arms names it
    ranks: int = 1  # > 1: each run is a torchrun launch of that many ranks on this host


@dataclass(frozen=True)
class Size:
    """The whole study at another size, behind --<name>: its overrides go to every run, its runs
    to runs/<study>_<name>, its report to docs/<study>/<name>."""

    name: str
    overrides: tuple[str, ...]
    help: str


@dataclass(frozen=True)
class Invocation:
    """One command of a study: its parsed flags, its folders, its runs and what they share."""

    args: argparse.Namespace
    root: Path  # the run dirs
    docs: Path  # where the report goes
    runs: list[StudyRun]
    overrides: list[str]  # every run's: preset, the study's shared ones, the size's, the `--` ones


@dataclass(frozen=True)
class Study:
    name: str  # sparrow.experiments.<name>_study; runs in runs/<name>, the report in docs/<name>
    doc: str  # the module's docstring: --help prints it
    arms: tuple[Arm, ...]
    report: Callable[[Invocation, dict[str, int]], object]  # given each run's total steps
    seeds: tuple[int, ...] = (0, 1, 2)  # --seeds' default; (): one run per arm, no seed set
    shared: tuple[str, ...] = ("logger=disabled", "rollout.progress=false")
    preset: str | None = None  # --preset's default; None: the study has no --preset
    sizes: tuple[Size, ...] = ()
    # Where DOCS already holds run `run` in full (kept in git, it outlives the run dirs of an
    # earlier checkout: the run is not run again), or None.
    archived: Callable[[Invocation, StudyRun, int], str | None] | None = None
    options: Callable[[argparse.ArgumentParser], None] | None = None  # the study's own flags

    @property
    def prog(self) -> str:
        return f"{self.name}_study"

    def runs(self, arms: list[str], seeds: list[int]) -> list[StudyRun]:
        """The named arms' runs in the declared order, seed-major (a stopped study has whole
        seeds to compare); `seed=S` alone seeds a run (sampling and prompt order both)."""
        chosen = [a for a in self.arms if a.name in arms]
        if not self.seeds:
            return [StudyRun(a.name, a.overrides, a.setting, a.ranks) for a in chosen]
        return [
            StudyRun(f"{a.name}_s{seed}", (*a.overrides, f"seed={seed}"), a.setting, a.ranks)
            for seed in seeds
            for a in chosen
        ]


def study_main(study: Study, argv: list[str] | None = None) -> int:
    """The study's command. Without `argv` this process is the command (sys.argv), and SIGTERM
    (`kill PID`) stops the current run as Ctrl-C does: `resume=auto` continues it later."""
    if argv is None:
        argv = sys.argv[1:]
        signal.signal(signal.SIGTERM, _stop_on_signal)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = _parser(study).parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    arms = _arm_names(study, args)
    if arms is None:
        return 2
    size = next((s for s in study.sizes if getattr(args, s.name)), None)
    folder = f"{study.name}_{size.name}" if size else study.name
    inv = Invocation(
        args=args,
        root=args.root or REPO / "runs" / folder,
        docs=args.docs or REPO / "docs" / study.name / (size.name if size else ""),
        runs=study.runs(arms, [int(s) for s in args.seeds.split(",")] if study.seeds else []),
        overrides=[
            *([f"preset={args.preset}"] if study.preset else []),
            *study.shared,
            *(size.overrides if size else ()),
            *extra,
        ],
    )
    return _drive(study, inv, argv)


def _arm_names(study: Study, args) -> list[str] | None:
    if args.arms is None:
        return [a.name for a in study.arms if a.flag is None or getattr(args, a.flag)]
    names = args.arms.split(",")
    unknown = sorted(set(names) - {a.name for a in study.arms})
    if unknown:
        known = [a.name for a in study.arms]
        print(f"{study.prog}: unknown arms {unknown}; known: {known}", file=sys.stderr)
        return None
    return names


def _drive(study: Study, inv: Invocation, argv: list[str]) -> int:
    """Detach (--background), print one line per run (--status), or run what is not finished
    and then write the report. An archived run counts as finished."""
    try:
        steps = {r.name: total_steps(inv.overrides, r) for r in inv.runs}
    except ConfigError as err:  # a bad override, caught before anything starts
        print(f"{study.prog}: config error: {err}", file=sys.stderr)
        return 2
    if inv.args.background:
        return _start_background(study, inv.root, [a for a in argv if a != "--background"])
    archived = study.archived or (lambda inv, run, steps: None)
    done = {r.name: where for r in inv.runs if (where := archived(inv, r, steps[r.name]))}
    if inv.args.status:
        for run in inv.runs:
            line = f"{run.name}: complete, archived in {done[run.name]}" if run.name in done else ""
            print(line or _status_line(inv.root, run, steps[run.name]))
        return 0
    if not inv.args.report:
        inv.root.mkdir(parents=True, exist_ok=True)
        for run in inv.runs:
            if run.name in done:
                record_status(inv.root, run, "skipped", f"archived in {done[run.name]}", 0.0)
        todo = [r for r in inv.runs if r.name not in done]
        code = run_all(study.prog, inv.root, todo, inv.overrides, steps, inv.args.jobs)
        if code:
            return code
    study.report(inv, steps)
    return 0


def _status_line(root: Path, run: StudyRun, steps: int) -> str:
    done = max(rows_by_step(root / run.name), default=0)
    state = "complete" if final_checkpoint(root / run.name, steps) else "incomplete"
    hours = run_wall_s(root, run.name) / 3600
    return f"{run.name}: {state}, {done}/{steps} steps logged, {hours:.2f} h"


def _start_background(study: Study, root: Path, argv: list[str]) -> int:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "study.log", "a") as log:  # the child holds its own copy of the file
        proc = subprocess.Popen(
            [sys.executable, "-m", f"sparrow.experiments.{study.prog}", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # survives the terminal; its runs go one after another
            cwd=REPO,
        )
    print(f"{study.prog} running in the background (pid {proc.pid}); log: {root / 'study.log'}")
    print(f"stop it with: kill {proc.pid}   (re-run the command to continue where it stopped)")
    return 0


def _stop_on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _parser(study: Study) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=study.prog, description=study.doc.splitlines()[0], usage=study.doc
    )
    if study.preset:
        p.add_argument("--preset", default=study.preset, help="Hydra preset shared by all runs")
    p.add_argument("--root", type=Path, default=None, help=f"study root (runs/{study.name})")
    p.add_argument("--docs", type=Path, default=None, help=f"the report (docs/{study.name})")
    p.add_argument("--arms", default=None, help="comma-separated arms (default: all)")
    if study.seeds:
        seeds = ",".join(map(str, study.seeds))
        p.add_argument("--seeds", default=seeds, help="comma-separated seeds")
    for arm in study.arms:
        if arm.flag:
            p.add_argument(f"--{arm.flag}", action="store_true", help=f"add {arm.setting}")
    sizes = p.add_mutually_exclusive_group()
    for size in study.sizes:
        where = f"runs/{study.name}_{size.name}"
        sizes.add_argument(f"--{size.name}", action="store_true", help=f"{size.help} ({where})")
    if study.options:
        study.options(p)
    p.add_argument(
        "--jobs", type=at_least(1), default=1, help="runs at a time, each with cores / jobs threads"
    )
    p.add_argument("--report", action="store_true", help="only write the report from the logs")
    p.add_argument("--status", action="store_true", help="print one line per run and exit")
    p.add_argument("--background", action="store_true", help="detach; log to ROOT/study.log")
    return p
