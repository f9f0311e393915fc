"""cluster.rollout_ranks before any process group: what it refuses in one line (no torchrun
launch, what rollout ranks do not run yet, bad values), and the host RAM a training rank plans
for when a rollout rank shares its host. The runs themselves: test_rollout_ranks.py (slow)."""

import pytest

from sparrow.cli.config_loader import load_config
from sparrow.train.config import ClusterConfig, MemoryConfig
from sparrow.train.memory.fit import GiB, rank_device_memory
from sparrow.train.rollouts.rank import join_cluster


def _cfg(*overrides: str):
    return load_config(["preset=tiny", *overrides])


def test_no_rollout_ranks_joins_nothing(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    assert join_cluster(_cfg()) is None


def test_rollout_ranks_need_a_torchrun_launch(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="needs a torchrun launch"):
        join_cluster(_cfg("cluster.rollout_ranks=1"))


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("rl.dynamic_sampling.enabled=true", "rl.dynamic_sampling is not supported yet"),
        ("distill=default", "distill.enabled is not supported yet"),
    ],
)
def test_what_rollout_ranks_do_not_run_yet_is_refused(monkeypatch, override, words):
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=words):
        join_cluster(_cfg("cluster.rollout_ranks=1", override))


def test_staleness_with_several_training_ranks_is_refused_on_every_rank(monkeypatch):
    monkeypatch.setenv("RANK", "2")  # the rollout rank says it too
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="runs one training rank for now, not 2"):
        join_cluster(_cfg("cluster.rollout_ranks=1", "rl.async.staleness=1"))


@pytest.mark.parametrize(
    "fields", [{"rollout_ranks": -1}, {"push_bucket_mb": 0}, {"bridge_timeout_min": 0}]
)
def test_bad_cluster_values_are_refused(fields):
    with pytest.raises(ValueError, match="cluster.rollout_ranks must be >= 0"):
        ClusterConfig(**fields)


def test_a_hosts_ram_is_shared_by_its_training_ranks_only(monkeypatch):
    cfg = MemoryConfig(device_gib=12.0)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert rank_device_memory(cfg, on_gpu=False).bytes == 3 * GiB
    monkeypatch.setenv("SPARROW_LOCAL_TRAINERS", "3")  # one of the four rolls out
    assert rank_device_memory(cfg, on_gpu=False).bytes == 4 * GiB
