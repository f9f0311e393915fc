"""A study's runs as `sparrow-train` processes, one at a time or `jobs` at once, each in its run
dir under the study root with `resume=auto` (a new invocation continues an interrupted run and
skips a finished one); a status line per start and end on stdout and in ROOT/status.jsonl. What
the runs are and what is made of them: study.py."""

import datetime
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sparrow.cli.config_loader import compose_dict
from sparrow.experiments.study_files import REPO
from sparrow.train.run.checkpoint import verify


@dataclass(frozen=True)
class StudyRun:
    name: str  # run directory name under the study root
    overrides: tuple[str, ...]  # Hydra overrides on top of the preset
    setting: str  # one line for the table
    ranks: int = 1  # > 1: a torchrun launch of that many ranks on this host


def _run_overrides(root: Path, overrides: list[str], run: StudyRun) -> list[str]:
    # The run's own settings come after the shared ones, so they win.
    return [*overrides, *run.overrides, f"run_dir={root / run.name}", "resume=auto"]


def total_steps(overrides: list[str], run: StudyRun) -> int:
    """rl.steps of the composed config (also catches a bad override before anything starts)."""
    return int(compose_dict(_run_overrides(Path("."), overrides, run)).rl.steps)


def final_checkpoint(run_dir: Path, steps: int) -> Path | None:
    """The run's final checkpoint when it is complete and intact, else None."""
    path = run_dir / "checkpoints" / f"step_{steps:06d}"
    return path if path.is_dir() and verify(path) is None else None


def run_all(
    prog: str, root: Path, runs: list[StudyRun], overrides: list[str], steps: dict, jobs: int = 1
) -> int:
    """Every run in `runs` not finished yet, `jobs` at a time; 2 when another invocation of the
    study (`prog`) is running in ROOT."""
    root.mkdir(parents=True, exist_ok=True)
    lock = root / "study.pid"
    if lock.exists() and _alive(int(lock.read_text() or 0)):
        print(f"{prog}: already running (pid {lock.read_text()})", file=sys.stderr)
        return 2
    lock.write_text(str(os.getpid()))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    try:
        if jobs == 1:
            for run in runs:
                _run_one(root, run, overrides, steps[run.name], threads)
        else:
            _run_parallel(root, runs, overrides, steps, jobs, threads)
    finally:
        lock.unlink(missing_ok=True)
    return 0


def _run_parallel(root, runs, overrides, steps, jobs: int, threads: int) -> None:
    """`jobs` runs at a time, in the given order. On Ctrl-C or SIGTERM (raised in this, the
    main thread) the running children are terminated; resume=auto continues them later."""
    stop = threading.Event()
    pending = list(runs)
    lock = threading.Lock()

    def worker():
        while not stop.is_set():
            with lock:
                if not pending:
                    return
                run = pending.pop(0)
            _run_one(root, run, overrides, steps[run.name], threads, stop)

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(jobs)]
    for w in workers:
        w.start()
    try:
        while any(w.is_alive() for w in workers):
            for w in workers:
                w.join(timeout=1.0)
    except BaseException:
        stop.set()
        for w in workers:
            w.join()
        raise


def _run_one(
    root: Path,
    run: StudyRun,
    overrides: list[str],
    steps: int,
    threads: int | None = None,
    stop: threading.Event | None = None,
) -> None:
    run_dir = root / run.name
    if final_checkpoint(run_dir, steps) is not None:
        record_status(root, run, "skipped", f"final checkpoint step {steps} exists", 0.0)
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "sparrow.cli.train", *_run_overrides(root, overrides, run)]
    if run.ranks > 1:  # torchrun's agent as scripts/launch_multinode.sh runs it
        launcher = ["sparrow.cli.launcher", "--standalone", f"--nproc-per-node={run.ranks}", "-m"]
        cmd[2:2] = launcher
    record_status(root, run, "started", " ".join(cmd[3:]), 0.0)
    t0 = time.monotonic()
    with open(run_dir / "console.log", "a") as log:
        log.write(f"\n=== {datetime.datetime.now().isoformat(timespec='seconds')} {cmd}\n")
        log.flush()
        env = _single_process_env(threads)
        if run.ranks > 1:  # torchrun would give each rank 1 thread; a one-process run has all
            env.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        try:
            rc = _wait(proc, stop)
        except BaseException:  # Ctrl-C or SIGTERM: stop the run too; resume=auto continues it
            proc.terminate()
            proc.wait()
            record_status(root, run, "interrupted", "", time.monotonic() - t0)
            raise
        if rc is None:  # the study was stopped while this run (in a worker thread) was going
            record_status(root, run, "interrupted", "", time.monotonic() - t0)
            return
    wall = time.monotonic() - t0
    if rc == 0 and final_checkpoint(run_dir, steps) is not None:
        record_status(root, run, "done", f"{steps} steps", wall)
    else:
        record_status(root, run, "failed", f"exit code {rc}, see {run_dir / 'console.log'}", wall)


def _wait(proc: subprocess.Popen, stop: threading.Event | None) -> int | None:
    """The child's exit code; None when `stop` was set first (the child is then terminated)."""
    if stop is None:
        return proc.wait()
    while True:
        try:
            return proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            if stop.is_set():
                proc.terminate()
                proc.wait()
                return None


def _single_process_env(threads: int | None = None) -> dict:
    """Each run is its own one-process job: rendezvous variables inherited from a parent (a
    torchrun launch, or an in-process trainer that exported them) would make it join that one.
    With several runs at a time each gets `threads` intra-op threads, so they do not oversubscribe
    the cores."""
    dist_vars = {"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE"}
    dist_vars.add("LOCAL_WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in dist_vars}
    if threads is not None and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def record_status(root: Path, run: StudyRun, status: str, detail: str, wall_s: float) -> None:
    """One status line on stdout and in ROOT/status.jsonl (which keeps each invocation's wall)."""
    now = datetime.datetime.now().isoformat(timespec="seconds")
    print(f"{now} {run.name}: {status} {detail} ({wall_s / 60:.1f} min)".rstrip(), flush=True)
    row = {"time": now, "run": run.name, "status": status, "detail": detail, "wall_s": wall_s}
    with open(root / "status.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
