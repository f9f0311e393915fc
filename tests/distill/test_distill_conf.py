"""conf/distill/*.yaml validate against DistillConfig (the group the lead registers as distill)."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sparrow.distill import DistillConfig

CONF = Path(__file__).resolve().parents[2] / "conf" / "distill"


@pytest.mark.parametrize("name,enabled", [("disabled", False), ("default", True)])
def test_group_files_validate(name, enabled):
    merged = OmegaConf.merge(
        OmegaConf.structured(DistillConfig), OmegaConf.load(CONF / f"{name}.yaml")
    )
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, DistillConfig) and cfg.enabled is enabled
    if enabled:
        assert cfg.lambda_k3 == 1e-3 and cfg.target_modules == "all-linear" and cfg.gate


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="rank"):
        DistillConfig(rank=0)
