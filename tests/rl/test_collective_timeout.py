"""The process group's collective timeout comes from actor.collective_timeout_min.

DeepSpeed's default (10 min) ends a run whenever one rank waits that long for another; between
collectives each rank rolls out its own prompts, and long-context rollouts differ by more.
"""

from datetime import timedelta

import pytest

from sparrow.rl import actor
from sparrow.rl.actor_config import ActorConfig


def test_init_distributed_passes_the_configured_timeout(monkeypatch):
    calls = []
    monkeypatch.setattr(actor.deepspeed, "init_distributed", lambda **kw: calls.append(kw))
    monkeypatch.setenv("WORLD_SIZE", "1")  # as under a launcher: no 1-rank env set-up here
    actor._init_distributed("gloo", ActorConfig(collective_timeout_min=90).collective_timeout_min)
    assert calls == [
        {
            "dist_backend": "gloo",
            "auto_mpi_discovery": False,
            "verbose": False,
            "timeout": timedelta(minutes=90),
        }
    ]
    assert ActorConfig().collective_timeout_min > 10  # above DeepSpeed's default


def test_timeout_must_be_positive():
    with pytest.raises(ValueError, match="collective_timeout_min"):
        ActorConfig(collective_timeout_min=0)
