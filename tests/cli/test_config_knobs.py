"""One truth per knob: the page size, the bin width and the top-K are each set in one place (a
key that held a copy is refused in one line naming the key to set), and a run whose loss names an
estimator or aggregation sparrow does not have is refused when the config loads, in one line,
before any model is built."""

import subprocess
import sys
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.cli.config_loader import ConfigError, load_config
from sparrow.cli.moved_keys import without_moved_keys

ROOT = Path(__file__).resolve().parents[2]


def test_each_shared_knob_has_one_key():
    keys = ["rollout.engine.page_size=4", "schedule.bin_tokens=8", "rollout.engine.topk_logprobs=5"]
    cfg = load_config(["preset=smoke", *keys])
    assert (cfg.rollout.engine.page_size, cfg.schedule.bin_tokens) == (4, 8)
    assert cfg.rollout.engine.topk_logprobs == 5
    assert not hasattr(cfg.schedule, "page_size")
    assert not hasattr(cfg.monitor, "bin_tokens") and not hasattr(cfg.monitor, "top_k")


def test_an_older_runs_stored_copies_are_dropped():
    tree = {"schedule": {"page_size": 16, "bin_tokens": 32}, "monitor": {"top_k": 20}, "seed": 0}
    assert without_moved_keys(tree) == {"schedule": {"bin_tokens": 32}, "monitor": {}, "seed": 0}
    assert tree["schedule"]["page_size"] == 16  # the caller's tree is left as it was


@pytest.mark.parametrize(
    "override, message",
    [
        ("schedule.page_size=4", "schedule.page_size is gone.*set rollout.engine.page_size$"),
        ("monitor.bin_tokens=64", "monitor.bin_tokens is gone.*set schedule.bin_tokens$"),
        ("monitor.top_k=5", "monitor.top_k is gone.*set rollout.engine.topk_logprobs$"),
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
        [*cmd, f"run_dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "rl.loss.kl_estimator='k2'" in lines[0], out.stderr
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before any step
