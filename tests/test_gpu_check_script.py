"""scripts/gpu_check.sh's kernels stage fits one 10-minute GPU call: the headline decode-step
bench runs first, every part is bounded by a timeout, and the timeouts sum to at most 9 minutes
(the wheel install before the parts is bounded by its own 60 s)."""

import re
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"


def kernels_parts() -> list[tuple[str, int, str]]:
    text = SCRIPT.read_text()
    start = text.index('if [ "$STAGE" = kernels ]; then')
    block = text[start : text.index("\nelse\n", start)]
    calls = re.findall(r"^\s*part (\S+) (\S+) (.*)$", block, flags=re.M)
    return [(name, int(limit), cmd) for name, limit, cmd in calls]


def test_kernels_stage_starts_with_the_headline_and_ends_inside_nine_minutes():
    parts = kernels_parts()
    assert parts[0][0] == "decode_step" and "decode-step --json" in parts[0][2]
    assert sum(limit for _, limit, _ in parts) <= 540, parts
    assert len(parts) >= 5  # decode-step, kernel tests, engine tests, decode bench, kernel bench


def test_decode_step_json_is_copied_for_docs_gpu():
    text = SCRIPT.read_text()
    assert '"$RESULTS/docs/gpu/decode_step_' in text
    assert "timeout 60" in text  # the wheel install
