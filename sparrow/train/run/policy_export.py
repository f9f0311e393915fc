"""The trained policy as an HF model directory, `run_dir/policy/`, never half-written; a LoRA RL
run's also holds `adapter/`: the adapter in peft's format, its base's ModelConfig beside it
(`base_model.json`, which sparrow.models.loading reads to load base + adapter).

The actor writes into `policy.tmp/` (rank 0; all ranks take part in gathering the weights), which
is then renamed to `policy/`: a crash or SIGKILL leaves at most `policy.tmp/` (removed by the next
export), and a SIGTERM/SIGINT during the export stops at once with one line (the final
checkpoint holds the weights; running the same command again resumes at the last step and
exports them), removing `policy.tmp/` on the way out.
"""

import json
import os
import shutil
from pathlib import Path

from sparrow.models.loading import ADAPTER_BASE
from sparrow.train.run.stop_outside_loop import stop_at_once


def export_policy(
    actor, tokenizer, final: Path, step: int, rank: int, base_model: dict | None = None
) -> None:
    """`actor.export_hf` into `final` through a temporary sibling (all ranks call);
    `base_model`: the run's ModelConfig as a dict, written beside an exported adapter."""
    tmp = final.with_name(final.name + ".tmp")
    advice = (
        f"checkpoint step_{step:06d} holds the trained weights; run the same command again to "
        f"write {final}"
    )
    with stop_at_once("the policy export", advice):
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # a killed export's leftover
        try:
            actor.export_hf(tmp, tokenizer)
            if rank == 0 and (tmp / "adapter").is_dir() and base_model is not None:
                (tmp / "adapter" / ADAPTER_BASE).write_text(json.dumps(base_model, indent=1))
            if rank == 0:
                shutil.rmtree(final, ignore_errors=True)  # an earlier launch's export
                os.replace(tmp, final)
        finally:
            if rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
