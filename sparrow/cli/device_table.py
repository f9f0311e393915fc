"""The README's table of which GPU preset fits which device, and with what: each preset's memory
plan, sized by the memory fit as `sparrow-train preset=P dry_run=true memory.device_gib=G` with
WORLD_SIZE=N sizes it (sparrow/train/memory/fit.py), written between marker lines so that the
README cannot drift from the plans.

    python -m sparrow.cli.device_table           # print the table and rewrite the README's
    python -m sparrow.cli.device_table --check   # exit 1 if the README's table is stale

A cell is the plan's peak against the usable memory (memory.headroom kept free) and what the fit
turned on beyond the preset (the engine's sleep, optimizer offload, activation checkpointing, a
smaller token budget per micro-batch), or the phase that does not fit.
"""

import argparse
import re
import sys
from dataclasses import replace
from pathlib import Path

from sparrow.cli.config_loader import load_config
from sparrow.models.model_config import read_model_config
from sparrow.models.shape import ModelShape
from sparrow.train.memory.fit import MemoryRefused, fit_memory, rank_device_memory
from sparrow.train.memory.plan import GiB

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
BEGIN, END = "<!-- device-table -->", "<!-- /device-table -->"
TABLE = re.compile(rf"^{BEGIN}\n.*?^{END}$", re.M | re.S)
# (column, ranks, GiB of one device): an 80 GB GPU (H100, A100-80G) and the paper's H200.
DEVICES = (("one 80 GB", 1, 80), ("one H200", 1, 139), ("4 x 80 GB", 4, 80),
           ("4 x H200", 4, 139))  # fmt: skip


def gpu_presets() -> list[str]:
    return sorted(p.stem for p in (REPO / "conf" / "preset").glob("*_gpu.yaml"))


def cell(preset: str, world: int, gib: int) -> str:
    """One preset on `world` devices of `gib` GiB: what fits and with what, or what does not."""
    cfg = load_config([f"preset={preset}"])
    config, _ = read_model_config(cfg.model)
    cfg = replace(cfg, memory=replace(cfg.memory, device_gib=float(gib)))
    device = rank_device_memory(cfg.memory, on_gpu=True)  # as the dry run reads it
    try:
        fitted = fit_memory(cfg, ModelShape.from_hf_config(config), world, True, device)
    except MemoryRefused as err:  # the phase the refusal names, as sparrow-train prints it
        found = re.search(r"does not fit: (.+?) needs ([\d.]+) GiB", str(err))
        assert found, str(err)
        return f"no: {found[1]} needs {float(found[2]):.0f} GiB"
    sleep = fitted.cfg.rollout.engine.sleep
    used = [] if sleep == "off" else [f"engine sleep ({sleep})"]
    if fitted.cfg.actor.offload_optimizer != "none":
        used.append("optimizer offload")
    if fitted.cfg.actor.activation_checkpointing:
        used.append("checkpointing")
    used += [c for c in fitted.changes if c.startswith("actor.max_tokens_per_micro_batch")]
    _, peak = fitted.plan.peak_phase()
    return f"{peak / GiB:.0f}/{device.usable / GiB:.0f} GiB" + "".join(f", {u}" for u in used)


def table() -> str:
    lines = ["| preset | " + " | ".join(name for name, _, _ in DEVICES) + " |"]
    lines.append("|---" * (len(DEVICES) + 1) + "|")
    for preset in gpu_presets():
        cells = [cell(preset, world, gib) for _, world, gib in DEVICES]
        lines.append(f"| `{preset}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def regenerate(text: str) -> str:
    """`text` (the README) with its table rewritten; ValueError without the markers."""
    if not TABLE.search(text):
        raise ValueError(f"README.md has no {BEGIN} ... {END} block")
    return TABLE.sub(lambda _: f"{BEGIN}\n{table()}\n{END}", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the README's is stale")
    args = parser.parse_args(argv)
    text = README.read_text()
    new = regenerate(text)
    if args.check:
        if new != text:
            print("README.md's device table is stale: python -m sparrow.cli.device_table")
            return 1
        return 0
    README.write_text(new)
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
