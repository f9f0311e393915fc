"""sparrow.experiments.multi_turn_study: its arms configure what they say on the shipped tool
task, and its report (multi_turn_table.py) reads hand-written metrics right: per-step means over
seeds, held-out accuracy before and after, the KV-read ratio per turn, and a missing run marked,
all from the copies under docs/ alone."""

import json
from pathlib import Path

from sparrow.cli.config_loader import load_config
from sparrow.experiments import multi_turn_study as study
from sparrow.experiments import multi_turn_table as table

ARMS = {arm.name: arm for arm in study.ARMS}


def test_the_arms_run_the_python_tool_task_sparse_at_tau_086_and_dense():
    for name, arm in ARMS.items():
        cfg = load_config([*study.STUDY.shared, *arm.overrides])
        assert cfg.env.function == "python"
        assert cfg.data.source.endswith("examples/gsm8k_mini.jsonl")
        assert cfg.model.name == "smollm2-135m-instruct"
        assert cfg.schedule.mode == ("dense" if name == "dense" else "online")
        assert cfg.controller.tau == 0.86
        assert (cfg.rl.steps, cfg.rl.eval.every) == (2, 1)
    runs = study.STUDY.runs(list(ARMS), [0, 1, 2])
    assert [r.name for r in runs] == [f"{a}_s{s}" for s in (0, 1, 2) for a in ("sparse", "dense")]


def _eval(step: int, accuracy: float) -> dict:
    return {"step": step, "eval/accuracy": accuracy, "eval/accuracy_lo95": accuracy / 2,
            "eval/accuracy_hi95": (1 + accuracy) / 2}  # fmt: skip


def _train(step: int, reward: float, turns: float, kv: dict[int, float]) -> dict:
    row = {"step": step, "reward/mean": reward, "episode/turns_mean": turns}
    row |= {"episode/tool_calls_mean": turns - 1, "kv_read_ratio": 0.5, "time/step_s": 30.0}
    return row | {f"kv_read_ratio/turn{t}": v for t, v in kv.items()}


def _write(root: Path, name: str, rows: list[dict]) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_report_reads_steps_turns_and_missing_runs_from_the_copies(tmp_path):
    root, docs = tmp_path / "runs", tmp_path / "docs"
    s0 = [_eval(0, 0.25), _train(1, 0.0, 1.0, {1: 0.4}) | _eval(1, 0.25)]
    s0 += [_train(2, 0.5, 2.0, {1: 0.6, 2: 0.2}) | _eval(2, 0.5)]
    s1 = [_eval(0, 0.0), _train(1, 0.25, 1.5, {1: 0.8, 2: 0.4}) | _eval(1, 0.0)]
    s1 += [_train(2, 0.25, 1.0, {1: 0.4}) | _eval(2, 0.75)]
    dense = [_eval(0, 0.0), _train(1, 0.0, 1.0, {1: 1.0}) | _eval(1, 0.0)]  # stopped at step 1
    _write(root, "sparse_s0", s0)
    _write(root, "sparse_s1", s1)
    _write(root, "dense_s0", dense)
    runs = study.STUDY.runs(list(ARMS), [0, 1])
    readme = table.write_multi_turn_report(root, runs, {r.name: 2 for r in runs}, docs)
    for name in ("sparse_s0", "sparse_s1", "dense_s0"):
        copy = docs / "runs" / name / "metrics.jsonl"
        assert copy.read_bytes() == (root / name / "metrics.jsonl").read_bytes()
    text = readme.read_text()
    lines = text.splitlines()

    def row(prefix: str) -> list[str]:
        line = next(x for x in lines if x.startswith(prefix))
        return [c.strip() for c in line.strip("|").split("|")]

    # Per step: sparse step 2 = mean of the seeds' (2.0 - 1, 1.0 - 1) calls, turns, reward, acc.
    assert row("| 2 | sparse |") == ["2", "sparse", "2", "0.500", "1.500", "0.375", "0.625"]
    assert row("| 0 | sparse |") == ["0", "sparse", "2", "-", "-", "-", "0.125"]
    assert row("| 1 | dense |") == ["1", "dense", "1", "0.000", "1.000", "0.000", "0.000"]
    assert not any(x.startswith("| 2 | dense |") for x in lines)
    # Per run: turn 2's ratio is the mean over the steps that reached it; dense_s1 missing.
    before_after = ["0.250 (0.125 to 0.625)", "0.500 (0.250 to 0.750)"]
    kv = ["0.500", "0.500", "0.200"]  # all turns, turn 1, turn 2
    assert row("| sparse_s0 |") == ["sparse_s0", "2/2", *before_after, *kv, "1.0"]
    assert row("| dense_s0 |")[1:2] == ["1/2"]
    assert row("| dense_s1 |")[1] == "missing (0/2)"
    # Per arm: finished runs only (dense has none).
    assert row("| sparse |") == ["sparse", "2 of 2", "0.125", "0.625", "0.125", "0.375",
                                 "0.550", "0.300"]  # fmt: skip
    assert row("| dense |")[:2] == ["dense", "0 of 2"]
    # The same table again from the copies alone (the run dirs gone).
    before = text.split("\n", 3)[3]
    for name in ("sparse_s0", "sparse_s1", "dense_s0"):
        (root / name / "metrics.jsonl").unlink()
    again = table.write_multi_turn_report(root, runs, {r.name: 2 for r in runs}, docs)
    assert again.read_text().split("\n", 3)[3] == before
