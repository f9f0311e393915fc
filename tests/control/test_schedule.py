"""Budget schedule: lookup, YAML round trip, validation, the Qwen3 presets."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from sparrow.control.schedule import (
    BudgetSchedule,
    ScheduleConfig,
    build_schedule,
    load_schedule_config,
    save_schedule_config,
)

CONF = Path(__file__).resolve().parents[2] / "conf" / "schedule"


def test_budget_per_bin_and_past_the_last_bin():
    s = BudgetSchedule(bin_tokens=100, budgets_pages=(4, 8, 8, 32))
    assert [s.budget_pages(t) for t in (0, 99, 100, 250, 399, 400, 10_000)] == [
        4,
        4,
        8,
        8,
        32,
        32,
        32,
    ]
    assert s.with_budgets([8, 8]).budget_pages(1000) == 8


@pytest.mark.parametrize(
    "budgets, match",
    [((8, 4), "non-decreasing: bin 1"), ((), "empty"), ((0, 4), "positive"), ((4, -1), "positive")],
)
def test_validation_errors(budgets, match):
    with pytest.raises(ValueError, match=match):
        BudgetSchedule(bin_tokens=100, budgets_pages=budgets)


def test_grid_and_mode_validation():
    with pytest.raises(ValueError, match="strictly increasing"):
        BudgetSchedule(100, (4,), grid_pages=(8, 4))
    with pytest.raises(ValueError, match="mode"):
        build_schedule(ScheduleConfig(mode="sparse", budgets_pages=[4]))
    assert build_schedule(ScheduleConfig(mode="dense")) is None
    with pytest.raises(ValueError, match="schedule.bin_tokens must be positive"):
        ScheduleConfig(mode="dense", bin_tokens=0)  # the monitor bins by it in every mode


def test_yaml_round_trip(tmp_path):
    cfg = ScheduleConfig("online", 500, [4, 8, 64], [4, 8, 16, 32, 64])
    path = tmp_path / "s.yaml"
    save_schedule_config(cfg, path, comment="calibrated\non a tiny model")
    assert path.read_text().startswith("# calibrated\n# on a tiny model\n")
    assert load_schedule_config(path) == cfg
    sched = build_schedule(cfg)
    save_schedule_config(sched.to_config(), path)
    assert build_schedule(load_schedule_config(path)) == sched


def test_load_rejects_unknown_keys_and_bad_schedules(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: fixed\nbin_tokens: 100\nbudget_pages: [4]\n")
    with pytest.raises(ValueError, match="unknown schedule keys"):
        load_schedule_config(bad)
    bad.write_text("mode: fixed\nbin_tokens: 100\nbudgets_pages: [8, 4]\n")
    with pytest.raises(ValueError, match=r"bad\.yaml: budgets_pages must be non-decreasing"):
        load_schedule_config(bad)
    # The page size is the engine's alone (issue 48): an old file's copy is named, not ignored.
    bad.write_text("mode: fixed\nbin_tokens: 100\npage_size: 16\nbudgets_pages: [4]\n")
    with pytest.raises(ValueError, match="page_size is no schedule key.*rollout.engine.page_size"):
        load_schedule_config(bad)


def test_presets_are_the_paper_tables_and_valid_hydra_groups():
    tokens = {
        "qwen3_1p7b_tau086": [512, 1024, 1536, 1536, 2048, 2560, 3072, 3584, 3584, 4096],
        "qwen3_4b_tau086": [512, 768, 1024, 1280, 1536, 2048, 2560, 3584, 4096, 4096]
        + [5120] * 4
        + [6144] * 4
        + [8192] * 2,
        "qwen3_8b_tau086": [512, 768, 1024, 1280, 2048, 2560, 3072]
        + [4096] * 4
        + [5120] * 6
        + [6144]
        + [7168] * 2,
    }
    for name, table in tokens.items():
        cfg = load_schedule_config(CONF / f"{name}.yaml")
        assert cfg.mode == "fixed" and cfg.bin_tokens == 2000
        assert cfg.budgets_pages == [t // 16 for t in table], name
        assert set(cfg.budgets_pages) <= set(cfg.grid_pages)  # the controller can step from it
    assert build_schedule(load_schedule_config(CONF / "dense.yaml")) is None
    for path in CONF.glob("*.yaml"):
        # What Hydra does with a config-group file over a structured-config schema.
        merged = OmegaConf.merge(OmegaConf.structured(ScheduleConfig), OmegaConf.load(path))
        assert OmegaConf.to_object(merged) == load_schedule_config(path)
