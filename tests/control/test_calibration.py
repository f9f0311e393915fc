"""Schedule calibration (control/calibration.py, sparrow-calibrate): the choice rule on
constructed data, the exact acceptance it measures on a tiny engine, and the CLI end to end."""

import json

import pytest
import torch
from tiny_lm import random_prompts

from sparrow.cli import calibrate
from sparrow.control.calibration import (
    AcceptanceSample,
    BudgetSweep,
    cheapest_schedule,
    constant_budget,
    measure_acceptance,
)
from sparrow.control.schedule import load_schedule_config
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams


def _sample(per_bin: dict[int, list[float]], bin_tokens: int = 10) -> AcceptanceSample:
    acc = [torch.tensor(v) for v in per_bin.values()]
    pos = [torch.full((len(v),), b * bin_tokens + 1) for b, v in per_bin.items()]
    return AcceptanceSample(acc, pos)


def test_cheapest_schedule_picks_per_bin_then_makes_it_monotone():
    ok, bad = [0.95] * 20, [0.5] * 3 + [0.95] * 17  # p5 0.95 vs 0.5
    sweep = BudgetSweep(
        10,
        {
            4: _sample({0: ok, 1: bad, 2: ok, 3: bad, 4: ok[:3]}),
            8: _sample({0: ok, 1: ok, 2: ok, 3: bad, 4: ok[:3]}),
            16: _sample({0: ok, 1: ok, 2: ok, 3: bad, 4: ok[:3]}),
        },
    )
    schedule, choices = cheapest_schedule(sweep, tau=0.86, min_tokens=10, grid_pages=[4, 8])
    # bin 2 alone would take 4 but follows bin 1's 8; bin 3 meets tau nowhere: the largest;
    # bin 4 has 3 tokens per budget: inherits.
    assert list(schedule.budgets_pages) == [4, 8, 8, 16, 16]
    assert [c.reason for c in choices] == [
        "meets tau",
        "meets tau",
        "meets tau",
        "no budget meets tau: largest",
        "too few tokens: inherited",
    ]
    assert schedule.grid_pages == (4, 8, 16)  # swept budgets join the grid
    with pytest.raises(ValueError, match="no bin has"):
        cheapest_schedule(sweep, tau=0.86, min_tokens=100, grid_pages=[4])


def test_measure_acceptance_dense_is_one_and_tight_budget_is_not(lively_llama):
    engine = LLMEngine(
        lively_llama.model, lively_llama.tokenizer, EngineConfig(page_size=4, num_pages=256)
    )
    prompt = random_prompts(lively_llama.model.config.vocab_size, [40], seed=3)[0]
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    dense, tight = measure_acceptance(engine, prompt, [None, constant_budget(3)], params, 1.0)
    assert torch.allclose(dense.acceptance[0], torch.ones(12), atol=1e-5)
    assert dense.kv_read_ratio == 1.0
    assert tight.acceptance[0].min() < 0.99 and tight.kv_read_ratio < 0.4
    assert tight.positions[0].tolist() == list(range(40, 52))


def test_sparrow_calibrate_writes_a_monotone_schedule(tmp_path, capsys):
    out = tmp_path / "cal"
    rc = calibrate.main(
        [
            "preset=tiny",
            "rollout.engine.page_size=4",
            "schedule.bin_tokens=8",
            "rollout.max_new_tokens=12",
            "--budgets",
            "3,4,6",
            "--prompts",
            "3",
            "--min-tokens",
            "4",
            "--online",
            "2",
            "--online-prompts",
            "2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    cfg = load_schedule_config(out / "schedule.yaml")
    budgets = cfg.budgets_pages
    assert cfg.mode == "fixed" and budgets == sorted(budgets) and set(budgets) <= {3, 4, 6}
    result = json.loads((out / "calibration.json").read_text())
    assert result["schedule_pages"] == budgets and set(result["bins"]) == {"3", "4", "6"}
    assert (out / "p5_vs_position.png").stat().st_size > 1000
    online = json.loads((out / "online.json").read_text())
    assert len(online["steps"]) == 2 and online["offline_schedule_pages"] == budgets
    assert "offline:" in capsys.readouterr().out


def test_sparrow_calibrate_rejects_bad_options(capsys):
    assert calibrate.main(["preset=tiny", "--budgets", "0,4"]) == 2
    assert "each budget must be between 1 page and the KV pool" in capsys.readouterr().err
    assert calibrate.main(["preset=tiny", "--bogus"]) == 2
