"""What a run is sized from, before any large allocation: its prompts and the memory plan they
set. Data comes first, so bad input fails in seconds rather than after DeepSpeed starts; prompts
the engine could not hold with a full completion are skipped and counted (context_room.py). The
memory plan is then taken against this rank's device before the engine's pool or the optimizer
exist: sized actor knobs replace the configured ones for the whole run, or the run stops here.
"""

import os
from typing import NamedTuple

from sparrow.models.shape import ModelShape
from sparrow.tasks.data import PromptDataset, PromptsTooLong, load_eval_prompts, load_prompts
from sparrow.train.config import SparrowConfig
from sparrow.train.memory.context_budget import context_room
from sparrow.train.memory.fit import Fitted, fit_memory, rank_device_memory


class RunInputs(NamedTuple):
    train_data: PromptDataset
    eval_data: PromptDataset  # never the training prompts
    memory: Fitted  # memory.cfg: the run's config, actor knobs sized to the device


def load_run_inputs(
    cfg: SparrowConfig, tokenizer, model_config, shape: ModelShape, on_gpu: bool, pinned
) -> RunInputs:
    """The prompts and the memory fit of `cfg` on this rank (`pinned`: keys the user set, which
    the fit leaves as set)."""
    room = context_room(cfg, model_config)
    try:
        train = load_prompts(cfg.data, tokenizer, context_tokens=room.tokens, heldout=False)
        held_out = load_eval_prompts(
            cfg.data, cfg.rl.eval.split, tokenizer, context_tokens=room.tokens
        )
    except PromptsTooLong as err:
        raise room.too_long(err) from err
    longest, prefix = train.prompt_lengths()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = rank_device_memory(cfg.memory, on_gpu)
    memory = fit_memory(cfg, shape, world, on_gpu, device, pinned, longest, prefix)
    return RunInputs(train, held_out, memory)
