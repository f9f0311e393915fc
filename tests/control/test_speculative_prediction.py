"""docs/gpu/speculative_prediction.md is what the cost model predicts now for the GPU check's
speculative arm (written before any GPU runs it; sparrow/control/speculative_prediction.py)."""

from pathlib import Path

from sparrow.control.speculative_prediction import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "gpu" / "speculative_prediction.md"


def test_the_committed_prediction_is_current():
    assert main(["--check", str(DOC)]) == 0


def test_a_stale_prediction_is_refused(tmp_path):
    stale = tmp_path / "p.md"
    stale.write_text(DOC.read_text().replace("| H200 | 64 |", "| H200 | 65 |", 1))
    assert main(["--check", str(stale)]) == 1
