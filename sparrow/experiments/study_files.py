"""The files every study reads and writes, whatever its table: a run's metrics.jsonl rows by step,
a run's wall time from the study's status.jsonl, the copies of the runs' metrics under docs/, and
the generated block between the table markers of a study's README."""

import json
import shutil
from pathlib import Path

from sparrow.train.logs.metrics_logger import read_metrics

REPO = Path(__file__).resolve().parents[2]
TABLE_BEGIN = "<!-- study-table:begin -->"
TABLE_END = "<!-- study-table:end -->"


def rows_by_step(run_dir: Path) -> dict[int, dict]:
    """metrics.jsonl rows keyed by step; a step re-logged after a resume keeps its last row."""
    rows: dict[int, dict] = {}
    for row in read_metrics(run_dir):
        rows[int(row["step"])] = row
    return rows


def run_wall_s(root: Path, name: str) -> float:
    """Seconds the study's invocations spent on run `name` (ROOT/status.jsonl); 0 without one."""
    path = root / "status.jsonl"
    if not path.is_file():
        return 0.0
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sum(r["wall_s"] for r in rows if r["run"] == name)


def splice_table(docs: Path, block: str, title: str) -> Path:
    """Write `block` (marker lines included) between the table markers of docs/README.md, or
    append it (to a new README titled `title` when none exists); returns the README's path."""
    readme = docs / "README.md"
    docs.mkdir(parents=True, exist_ok=True)
    text = readme.read_text() if readme.is_file() else f"# {title}\n\n{TABLE_BEGIN}\n{TABLE_END}\n"
    if TABLE_BEGIN in text and TABLE_END in text:
        before, rest = text.split(TABLE_BEGIN, 1)
        text = before + block + rest.split(TABLE_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    readme.write_text(text)
    return readme


def copy_metrics(root: Path, names: list[str], docs: Path) -> None:
    """ROOT/<run>/metrics.jsonl -> DOCS/runs/<run>/metrics.jsonl for every run that has one."""
    for name in names:
        source = root / name / "metrics.jsonl"
        if source.is_file():
            target = docs / "runs" / name / "metrics.jsonl"
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(".tmp")
            shutil.copyfile(source, tmp)
            tmp.replace(target)
