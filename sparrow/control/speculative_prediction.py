"""The cost model's prediction for the GPU check's speculative arm, written before any GPU runs it.

    python -m sparrow.control.speculative_prediction --write docs/gpu/speculative_prediction.md
    python -m sparrow.control.speculative_prediction --check docs/gpu/speculative_prediction.md

The arm (sparrow-bench decode-step --speculative-k) times, at the headline's shape (Qwen3-1.7B,
32K context, 2K-token budget, batch 16 and 64, bf16), one sparse decode step, one dense decode step
and one dense verify pass of k + 1 positions, and reports the speculative speedup over dense
decode at an acceptance a, E(a, k) x dense_ms / (k x sparse_ms + verify_ms). This module prints
what cost_model.py predicts for the same ratio on an H100 and an H200 (their FLOPs per byte), at
the acceptance the calibration measured (docs/calibration/calibration.json: the per-bin mean at
the budget whose KV-read ratio is nearest the headline's 1/16, measured on SmolLM2-135M at 2-4K
context, an assumption for Qwen3-1.7B at 32K) and at a grid of others, with the best k of 1..8
for each. `--check` exits 1 when the file differs from what the cost model now gives.
"""

import argparse
import json
import sys
from pathlib import Path

from sparrow.control.cost_model import CostConfig, predicted_speedup, speculative_speedup
from sparrow.control.schedule import BudgetSchedule
from sparrow.models.random_init import random_model_config
from sparrow.models.shape import ModelShape

# FLOPs per byte: dense bf16 tensor-core FLOP/s over memory bandwidth (SXM parts).
DEVICES = {"H100": 989e12 / 3.35e12, "H200": 989e12 / 4.8e12}
CALIBRATION = Path(__file__).resolve().parents[2] / "docs" / "calibration" / "calibration.json"
GRID = (0.6, 0.7, 0.8, 0.9, 0.95)
ARM_K = 4  # the k the GPU check's arm verifies (scripts/gpu_check.sh)
CONTEXT, BUDGET_TOKENS, PAGE_SIZE, BATCHES = 32768, 2048, 16, (16, 64)


def calibrated_acceptance(path: Path = CALIBRATION) -> tuple[int, list[float]]:
    """(budget pages, per-bin means) of the calibration's budget whose KV-read ratio is nearest
    the headline's budget over context."""
    data = json.loads(path.read_text())
    target = BUDGET_TOKENS / CONTEXT
    budget = min(data["kv_read_ratio"], key=lambda b: abs(data["kv_read_ratio"][b] - target))
    return int(budget), [round(b["mean"], 3) for b in data["bins"][budget]]


def report() -> str:
    shape = ModelShape.from_hf_config(random_model_config("qwen3-1.7b"))
    budget_pages, means = calibrated_acceptance()
    schedule = BudgetSchedule(CONTEXT, (BUDGET_TOKENS // PAGE_SIZE,), (BUDGET_TOKENS // PAGE_SIZE,))
    lines = [
        "# The cost model's prediction for the GPU check's speculative arm",
        "",
        "Written before any GPU ran the arm, by",
        "`python -m sparrow.control.speculative_prediction --write "
        "docs/gpu/speculative_prediction.md`",
        "(tests/control/test_speculative_prediction.py fails when this file is stale).",
        "",
        f"Shape: Qwen3-1.7B, {CONTEXT} cached tokens per sequence, drafts at a "
        f"{BUDGET_TOKENS}-token budget ({BUDGET_TOKENS // PAGE_SIZE} pages of {PAGE_SIZE}; "
        "layers 0-1 dense), bf16, the dense verify pass reading the weights and each layer's "
        "K/V once for its k + 1 positions. Speedup: speculative tokens/s over dense decode's, "
        "E(a, k) = (1 - a^(k+1)) / (1 - a) tokens per round for k sparse steps and one verify. "
        f"The arm measures k = {ARM_K}; the best k of 1-8 is the cost model's.",
        "",
        f"Calibrated a: {', '.join(f'{m:.3f}' for m in means)} (docs/calibration/calibration.json, "
        f"per-bin means at {budget_pages} pages, the budget whose KV-read ratio is nearest "
        f"{BUDGET_TOKENS}/{CONTEXT}; measured on SmolLM2-135M at 2-4K context: an assumption "
        "for this shape, which the arm's measured times and a Qwen3 calibration replace).",
        "",
        "| device | batch | approximate sparse decode | a | speculative, k = 4 | best k | "
        "speculative, best k |",
        "|---|---|---|---|---|---|---|",
    ]
    for device, flops_per_byte in DEVICES.items():
        cfg = CostConfig(PAGE_SIZE, flops_per_byte=flops_per_byte, num_dense_layers=2)
        for batch in BATCHES:
            sparse = predicted_speedup(shape, CONTEXT, 1, batch, schedule, cfg)
            for a in sorted({*means, *GRID}):
                by_k = {
                    k: speculative_speedup(shape, CONTEXT, k, batch, schedule, a, cfg)
                    for k in range(1, 9)
                }
                best = max(by_k, key=lambda k: by_k[k])
                lines.append(
                    f"| {device} | {batch} | {sparse:.2f}x | {a:.3f} | {by_k[ARM_K]:.2f}x | "
                    f"{best} | {by_k[best]:.2f}x |"
                )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = p.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, help="write the prediction (markdown) here")
    group.add_argument("--check", type=Path, help="exit 1 if this file is not the prediction")
    args = p.parse_args(argv)
    text = report()
    if args.write:
        args.write.write_text(text)
    elif args.check:
        if not args.check.exists() or args.check.read_text() != text:
            print(f"stale: {args.check} (run python -m {__spec__.name} --write {args.check})",
                  file=sys.stderr)  # fmt: skip
            return 1
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
