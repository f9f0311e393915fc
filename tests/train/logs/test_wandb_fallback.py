"""W&B online mode without an API key, or with one but no reachable server, falls back to
offline logging with a warning instead of ending the run.

The real wandb client: no key (HOME without a .netrc), and a made-up key with WANDB_BASE_URL at
a closed local port (what a compute node without internet sees). Before the fix in
metrics_logger, the second case died in the fallback itself: the failed online attempt kept the
run id registered with the wandb service ("run ID ... is in use").
"""

import json
import logging
import socket

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.train.logs.metrics_logger import LoggerConfig, MetricsLogger, WandbConfig

WARNING_LOGGER = "sparrow.train.logs.metrics_logger"


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc, no ~/.config/wandb
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "home").mkdir()
    return monkeypatch


def _closed_port() -> int:
    with socket.socket() as s:  # bound then released: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_and_close(run_dir, init_timeout_s: float = HANG_GUARD_S) -> dict:
    cfg = LoggerConfig(wandb=WandbConfig(mode="online", init_timeout_s=init_timeout_s))
    logger = MetricsLogger(cfg, run_dir, {"lr": 1e-5})
    run = logger._wandb.run
    assert run is not None and run.settings.mode == "offline"
    logger.log(1, {"loss/loss": 0.5})
    logger.close()
    return json.loads((run_dir / "metrics.jsonl").read_text())


def test_online_without_a_key_logs_offline_with_a_warning(wandb_env, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=WARNING_LOGGER):
        row = _log_and_close(tmp_path / "run")
    assert "W&B online requested but no API key found: logging offline instead" in caplog.text
    assert row == {"step": 1, "loss/loss": 0.5}
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))


def test_online_without_network_logs_offline_with_a_warning(wandb_env, tmp_path, caplog):
    wandb_env.setenv("WANDB_API_KEY", "0" * 40)
    wandb_env.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    with caplog.at_level(logging.WARNING, logger=WARNING_LOGGER):
        # The online attempt is what init_timeout_s bounds (wandb retries a refused connection
        # until then); without a key there is none, and the offline init only has the guard.
        row = _log_and_close(tmp_path / "run", init_timeout_s=5.0)
    assert "W&B online init failed" in caplog.text and "logging offline instead" in caplog.text
    assert row == {"step": 1, "loss/loss": 0.5}
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))
