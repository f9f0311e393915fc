"""sparrow.experiments.parity_study: the arm x seed runs it launches (same seeds across arms),
and its report's arithmetic on hand-written metrics (the acceptance checks of the default run:
KV-read after the settling steps, p5 >= tau - 0.02 per bin, paired gain per arm)."""

import json

from sparrow.experiments import parity_study
from sparrow.experiments import parity_table as table


def test_runs_cover_every_arm_with_the_same_seeds():
    runs = parity_study.STUDY.runs(["online", "dense", "aggressive"], [0, 1])
    assert [r.name for r in runs] == [
        "online_s0", "dense_s0", "aggressive_s0", "online_s1", "dense_s1", "aggressive_s1",
    ]  # fmt: skip
    for run in runs:
        seed = run.name.rsplit("_s", 1)[1]
        # `seed` alone derives both the sampling and the prompt order (sparrow/train/run/seeds.py)
        assert f"seed={seed}" in run.overrides
        assert not any(
            o.startswith(("data.shuffle_seed", "rollout.engine.seed")) for o in run.overrides
        )
    assert "schedule.mode=dense" in runs[1].overrides
    assert not any(o.startswith("schedule") for o in runs[0].overrides)  # online = the default


def _write(run_dir, rows):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_summary_reads_the_acceptance_figures(tmp_path):
    rows = [{"step": 0, "eval/accuracy": 0.3}]
    for step in range(1, 7):
        row = {"step": step, "reward/mean": 0.1 * step, "kv_read_ratio": 0.9 if step <= 3 else 0.5}
        row |= {"accept/p5/bin12": 0.9, "accept/p5/bin13": 0.8 if step in (5, 6) else 0.88}
        # Step 6's low bin holds too few tokens to count (controller.min_tokens, 50).
        row |= {"accept/count/bin12": 200, "accept/count/bin13": 40 if step == 6 else 60}
        row["correction/truncated_frac"] = 0.01 * step
        row["update/no_signal"] = float(step == 2)  # one step without any reward signal
        rows.append(row)
    rows[-1] |= {"eval/accuracy": 0.5, "eval/delta": 0.2, "eval/delta_lo95": 0.1}
    rows[-1]["eval/delta_hi95"] = 0.3
    _write(tmp_path / "online_s0", rows)
    run = table.summarize_run(tmp_path, "online_s0", steps=6)
    assert run.arm == "online" and run.steps_logged == 6
    assert (run.before, run.after, run.delta) == (0.3, 0.5, (0.2, 0.1, 0.3))
    assert run.kv_read == 0.5  # steps 4-6 only: the first three are the controller settling
    assert run.p5_held == 2 / 3  # step 5's bin 13 (0.80) is below tau - 0.02; step 6's is thin
    assert run.p5_by_bin == {12: 0.9, 13: 0.8}
    assert abs(run.tis_truncated - 0.035) < 1e-12
    # The parity runs were logged before the rename: their key still reads.
    assert table.truncated_frac({"update/tis_truncated_frac": 0.04}) == 0.04
    assert run.updates == 5
    assert "| 0.200 -> 0.500 | 5 | 0.50 |" in table.format_runs([run])

    _write(tmp_path / "online_s1", [{"step": 0, "eval/accuracy": 0.4}])  # not finished
    arms = table.format_arms([run, table.summarize_run(tmp_path, "online_s1", steps=6)])
    assert "| online | 1 | 0.500 (0.500-0.500) | +0.200 | 0.50 | 0.0350 |" in arms
