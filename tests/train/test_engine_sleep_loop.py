"""The trainer's engine sleep (rollout.engine.sleep): asleep through every actor phase, awake for
the rollout and the monitor's engine passes, and a run that sleeps is the run that does not,
metric for metric and weight for weight (the tiny loop of test_loop_fake_actor with the speedup
probe on, which re-rolls out on the engine after the update, and DistillSparse's phase)."""

import json
import re

import pytest
import torch
from test_loop_fake_actor import _trainer

_TIMINGS = re.compile(r"^time/|_s$|tok_s|/tokens_per_s|^speedup/measured$|^memory/")
EXTRA = ("rl.steps=3", "monitor.speedup_every=2", "distill=default")


def _run(run_dir, sleep: str) -> tuple[list[dict], dict, list[tuple]]:
    trainer = _trainer(run_dir, *EXTRA, f"rollout.engine.sleep={sleep}")
    states = []  # the engine during each actor phase: (asleep, weight bytes)
    engine = trainer.engine

    def watch(method):
        def watched(*args, **kwargs):
            weights = engine.runner.model.embed.untyped_storage().nbytes()
            states.append((method.__name__, engine.asleep, weights))
            return method(*args, **kwargs)

        return watched

    trainer.actor.train_step = watch(trainer.actor.train_step)
    trainer.distill.step = watch(trainer.distill.step)
    trainer.fit()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if not _TIMINGS.search(k)} for r in rows]
    return rows, trainer.actor.gathered_state_dict(), states


@pytest.fixture(scope="module")
def awake(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("awake"), "off")


@pytest.mark.parametrize("sleep", ["kv", "weights"])
def test_sleeping_run_equals_the_awake_one(tmp_path, awake, sleep):
    rows, weights, states = _run(tmp_path, sleep)
    awake_rows, awake_weights, awake_states = awake
    assert rows == awake_rows
    assert all(torch.equal(weights[k], awake_weights[k]) for k in awake_weights)
    assert all(not asleep for _, asleep, _ in awake_states)
    assert len(states) == 6 and all(asleep for _, asleep, _ in states)
    freed = [nbytes == 0 for _, _, nbytes in states]  # (update, distill) of each step
    if sleep == "kv":
        assert not any(freed)
    else:  # step 2's update keeps the weights for the speedup probe after it, then frees them
        assert freed == [True, True, False, True, True, True]
