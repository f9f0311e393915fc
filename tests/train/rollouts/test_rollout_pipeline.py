"""The asynchronous loop's rollout producer (sparrow/train/rollouts/pipeline.py) and its config key:
a draw runs in another thread while the caller goes on, `wait` blocks until it is done (the
trainer calls it before the engine's weights change), a failed draw raises in the caller, and a
finished draw not yet taken survives a checkpoint round trip."""

import threading

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.cli.config_loader import ConfigError, load_config, python_key
from sparrow.train.rollouts.drawn import DrawnStep
from sparrow.train.rollouts.pipeline import RolloutPipeline


def _drawn(step: int) -> DrawnStep:
    return DrawnStep(step, None, step - 1, None, {"async/draw_s": 0.0})  # type: ignore[arg-type]


def test_the_draw_runs_while_the_caller_goes_on():
    release = threading.Event()
    started = threading.Event()

    def draw(step: int) -> DrawnStep:
        started.set()
        assert release.wait(HANG_GUARD_S), "the caller never released the draw"
        return _drawn(step)

    pipeline = RolloutPipeline(draw)
    pipeline.submit(3)
    # Running in its own thread, though the caller has not waited yet.
    assert started.wait(HANG_GUARD_S)
    assert pipeline.pending == 3
    release.set()  # the caller's work (the update) ends; only now can the draw finish
    assert pipeline.result(3).step == 3
    assert pipeline.pending is None


def test_result_draws_when_nothing_was_submitted_and_refuses_another_step():
    calls = []
    pipeline = RolloutPipeline(lambda step: calls.append(step) or _drawn(step))
    assert pipeline.result(0).step == 0  # the first step, or one resumed without a saved draw
    pipeline.submit(1)
    with pytest.raises(RuntimeError, match="step 1's rollout is still pending"):
        pipeline.submit(2)
    with pytest.raises(RuntimeError, match="step 1's rollout is pending, step 2 asked"):
        pipeline.result(2)
    assert pipeline.result(1).step == 1
    assert calls == [0, 1]


def test_a_failed_draw_raises_in_the_caller():
    def draw(step: int) -> DrawnStep:
        raise ValueError(f"engine failed in step {step}")

    pipeline = RolloutPipeline(draw)
    pipeline.submit(4)
    with pytest.raises(ValueError, match="engine failed in step 4"):
        pipeline.wait()
    assert pipeline.pending is None  # the loop may stop; nothing is left pending


def test_a_finished_draw_survives_the_checkpoint():
    first = RolloutPipeline(_drawn)
    first.submit(5)
    state = first.state_dict()  # waits for the draw in flight
    assert state is not None and state["drawn"].step == 5
    calls = []
    resumed = RolloutPipeline(lambda step: calls.append(step) or _drawn(step))
    resumed.load_state_dict(state)
    assert resumed.pending == 5
    assert resumed.result(5).version == 4
    assert calls == []  # trained from the checkpoint, not drawn again
    assert RolloutPipeline(_drawn).state_dict() is None  # the synchronous loop saves nothing


def test_the_async_key_users_type():
    assert python_key("rl.async.staleness=1") == "rl.async_rollout.staleness=1"
    assert python_key("+rl.async.staleness=1") == "+rl.async_rollout.staleness=1"
    assert python_key("rl.asynchronous=1") == "rl.asynchronous=1"  # only the whole key word
    assert load_config(["rl.async.staleness=1"]).rl.async_rollout.staleness == 1
    assert load_config([]).rl.async_rollout.staleness == 0  # the default: today's loop
    with pytest.raises(ConfigError, match="rl.async.staleness=2: 0 .* or 1"):
        load_config(["rl.async.staleness=2"])
