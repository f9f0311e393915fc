"""The W&B run's definitions, read back from an offline run's .wandb file with wandb's own
protobuf classes: `step` is every metric's x axis, and the run table's summaries are the lowest
p5 of each position bin and the last KV-read ratio (not W&B's default, the last of everything);
the p5 heat map's table holds every step's per-bin p5."""

import importlib.util
import json
from pathlib import Path

from sparrow.train.logs.metrics_logger import LoggerConfig, MetricsLogger, WandbConfig

WANDB_FILES = Path(__file__).resolve().parents[1] / "wandb_files.py"


def _wandb_files():
    spec = importlib.util.spec_from_file_location("wandb_files", WANDB_FILES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step_axis_summaries_and_heatmap_table(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = MetricsLogger(LoggerConfig(wandb=WandbConfig(heatmap_every=2)), tmp_path, {})
    p5 = [(0.9, 0.95), (0.7, 0.97), (0.8, 0.93)]  # (bin 0, bin 1) per step
    for step, (bin0, bin1) in enumerate(p5, start=1):
        logger.log(
            step, {"accept/p5/bin0": bin0, "accept/p5/bin1": bin1, "kv_read_ratio": step / 10}
        )
    logger.close()

    files = _wandb_files()
    files.wait_until_written(tmp_path)
    (path,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = list(files.records(path))
    metrics = {
        r.metric.name or r.metric.glob_name: r.metric for r in records if r.HasField("metric")
    }
    assert all(metrics[k].step_metric == "step" for k in ("accept/p5/bin0", "kv_read_ratio"))
    assert metrics["accept/p5/bin1"].summary.min and metrics["kv_read_ratio"].summary.last
    assert not [name for name in metrics if "*" in name]  # globs: wandb picks among overlaps
    summary = {}
    for record in records:
        if record.HasField("summary"):
            for u in record.summary.update:
                summary[u.key or "/".join(u.nested_key)] = json.loads(u.value_json)
    assert summary["accept/p5/bin0"] == {"min": 0.7}
    assert summary["accept/p5/bin1"] == {"min": 0.93}
    assert summary["kv_read_ratio"] == {"last": 0.3}

    steps = files.logged_steps(tmp_path)
    assert [steps[s]["step"] for s in (1, 2, 3)] == [1, 2, 3]
    # Re-logged at step 2 (heatmap_every) and at the end: all steps so far, 2 bins each.
    assert (
        steps[2]["accept/p5_heatmap/nrows"] == 2 * 2
        and steps[3]["accept/p5_heatmap/nrows"] == 3 * 2
    )
    (table_file,) = [
        p
        for p in tmp_path.glob("wandb/offline-run-*/files/media/table/accept/*.json")
        if "_3_" in p.name
    ]
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["step", "bin", "p5"]
    assert [row[2] for row in table["data"] if row[1] == 0] == [0.9, 0.7, 0.8]
