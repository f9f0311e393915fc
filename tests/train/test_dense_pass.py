"""rl.dense_pass through the loop (tiny model): `update` (the update's forward gives the dense
log-probs, top-K, entropy and exact acceptance) runs the same steps as `separate` (a no-grad
pass before the update) to float tolerance, with the real DeepSpeed actor; and the fallbacks to
a separate pass: readers before the loss, no update forward."""

import json

import pytest
import torch
from test_loop_fake_actor import OVERRIDES, _parity, _trainer

from sparrow.cli.config_loader import load_config
from sparrow.tasks.rewards import GuardedReward
from sparrow.train.policy_update import dense_pass
from sparrow.train.trainer import GRPOTrainer

TIMING = ("time/", "throughput/", "speedup/", "memory/")
# Measured on the shared 2-core CPU: the largest difference between the two runs' values was
# 0 (bit-equal) for the metrics and the weights; the bound leaves room for BLAS shapes.
RTOL, ATOL = 1e-5, 1e-6


def _run(run_dir, mode: str) -> tuple[list[dict], dict]:
    # Several micro-batches (groups of 4, at most 3 rows: one group each), exact rows every 2nd.
    extra = ["rl.steps=2", "actor.micro_batch_size=3", "monitor.exact_fraction=0.5"]
    cfg = load_config([*OVERRIDES, *extra, f"rl.dense_pass={mode}", f"run_dir={run_dir}"])
    trainer = GRPOTrainer.from_config(cfg)  # the DeepSpeed actor
    trainer.draw.reward = GuardedReward(_parity, "parity")
    trainer.fit()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    weights = {k: v.clone() for k, v in trainer.actor.gathered_state_dict().items()}
    return rows, weights


@pytest.mark.slow  # two 2-step runs with the DeepSpeed actor: ~100 s on the shared 2-core box
def test_update_forward_runs_the_separate_pass_steps(tmp_path):
    one, theta_one = _run(tmp_path / "one", "update")
    two, theta_two = _run(tmp_path / "two", "separate")
    assert len(one) == len(two) == 2
    for a, b in zip(one, two, strict=True):
        assert "time/logprobs_s" not in a and "time/logprobs_s" in b  # one forward vs two
        assert a["update/no_signal"] == 0.0  # the update ran, so its forward scored the batch
        keys = {k for k in b if not k.startswith(TIMING)}
        assert keys == {k for k in a if not k.startswith(TIMING)}
        assert a["accept/p5_min"] < 1.0  # the exact acceptance measured something
        for key in sorted(keys):
            if isinstance(b[key], float):
                assert a[key] == pytest.approx(b[key], rel=RTOL, abs=ATOL, nan_ok=True), key
            else:
                assert a[key] == b[key], key
    for name in theta_two:
        torch.testing.assert_close(theta_one[name], theta_two[name], rtol=RTOL, atol=ATOL)


def test_no_signal_step_takes_a_separate_pass(tmp_path):
    """A step whose advantages are all zero skips its update: no forward to read, so the
    monitor and the log get a separate dense pass, and the run goes on."""
    trainer = _trainer(tmp_path, "rl.steps=1", "rl.skip_no_signal=true")
    trainer.draw.reward = GuardedReward(lambda prompt, completion, reference: 0.0, "zero")
    trainer.fit()
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row["update/no_signal"] == 1.0
    assert row["time/logprobs_s"] >= 0.0  # the fallback pass ran
    assert 0.0 < row["accept/p5_min"] <= 1.0  # and fed the monitor


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([], "update"),
        (["rl.dense_pass=separate"], "separate"),
        (["rl.correction.mode=seq_mask"], "separate"),  # the rejection reads them before
        (["rl.update_policy=false"], "separate"),  # no update forward
    ],
)
def test_dense_pass_falls_back_when_a_reader_needs_a_pass(overrides, expected):
    cfg = load_config([*OVERRIDES, *overrides])
    mode, why = dense_pass(cfg)
    assert mode == expected and why


def test_unknown_dense_pass_is_refused():
    from sparrow.cli.config_loader import ConfigError

    with pytest.raises((ConfigError, ValueError), match="dense_pass"):
        load_config([*OVERRIDES, "rl.dense_pass=both"])
