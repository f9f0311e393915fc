"""One truth per knob: the copies components share are derived in conf/ from one place, and a
run whose copies disagree (or whose loss names an estimator or aggregation sparrow does not
have) is refused when the config loads, in one line, before any model is built."""

import subprocess
import sys
from pathlib import Path

import pytest

from sparrow.cli.config_loader import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_shared_knobs_follow_their_source():
    cfg = load_config(["preset=smoke", "schedule.page_size=4", "schedule.bin_tokens=8"])
    assert cfg.rollout.engine.page_size == 4 and cfg.monitor.bin_tokens == 8
    cfg = load_config(["preset=smoke", "monitor.top_k=5"])
    assert cfg.rollout.engine.topk_logprobs == 5


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.engine.page_size=4", "engine.page_size=4 differs from schedule.page_size"),
        ("monitor.bin_tokens=64", "monitor.bin_tokens=64 differs from schedule.bin_tokens"),
        ("rollout.engine.topk_logprobs=5", "differs from monitor.top_k=20"),
        ("rl.loss.kl_estimator=k2", "rl.loss.kl_estimator='k2': expected one of"),
        ("rl.loss.aggregation=seq-mean", "rl.loss.aggregation='seq-mean': expected one of"),
        ("rl.overlong.buffer=-4", "rl.overlong needs buffer >= 0"),
        ("rl.correction.mode=icepop", "rl.correction.mode='icepop': expected one of"),
        ("rl.correction.lo=6", "rl.correction needs cap > 0 and 0 <= lo <= hi"),
        ("rl.dynamic_sampling.max_rounds=0", "rl.dynamic_sampling.max_rounds must be >= 1"),
    ],
)
def test_disagreeing_knobs_are_refused_at_load(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["preset=smoke", override])


def test_a_bad_loss_knob_on_smoke_is_one_line_at_load(tmp_path):
    cmd = [sys.executable, "-m", "sparrow.cli.train", "preset=smoke", "rl.loss.kl_estimator=k2"]
    out = subprocess.run(
        [*cmd, f"run_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "rl.loss.kl_estimator='k2'" in lines[0], out.stderr
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before any step
