"""The resolved config a run dir was started with, and the check that a resume matches it.

The first launch in a run dir writes `run_config.json` (the whole resolved config). A later
launch that resumes from a checkpoint in that dir compares its own config with the stored one
on the keys that change what is trained (model, data, batch shape, optimizer, loss, seed); any
difference stops the launch with the list of keys, unless `resume_mismatch=allow`. Keys that a
resumed run may change on purpose (rl.steps, evaluation, logging, checkpoints, the controller
and its schedule) are not compared. Each accepted launch rewrites the file with its config.
Local paths in it (PATH_KEYS: the data files, a reward file) are absolute, as the CLI resolves
them when it loads the config.
"""

import json
import os
from pathlib import Path
from typing import Any

from sparrow.tasks.data_sources import is_local

FILE_NAME = "run_config.json"
# Keys that may hold a local path, stored absolute (the CLI resolves them when it loads the
# config): the run dir is then read from any directory (sparrow-eval), and a resume from another
# directory cannot pick up another file of the same relative name unnoticed.
PATH_KEYS = ("data.source", "data.eval_source", "rl.reward.function")
# Dotted prefixes of the keys whose change makes a resumed run a different run.
RUN_KEYS = (
    "model.",
    "data.",
    "seed",
    "rollout.engine.seed",
    "rl.prompts_per_step",
    "rl.group_size",
    "rl.loss.",
    "rl.correction.",
    "rl.dynamic_sampling.",
    "rl.async_rollout.",  # stale rows train differently; a checkpoint may hold the next draw
    "rl.advantage.",
    "rl.reward.",
    "rollout.max_new_tokens",
    "rollout.temperature",
    "rollout.top_p",
    "rollout.top_k",
    "actor.lr",
    "actor.lr_schedule",
    "actor.betas",
    "actor.weight_decay",
    "actor.grad_clip",
    "actor.warmup_steps",
    "actor.total_steps",
    "actor.zero_stage",
    "actor.precision",
    "distill.",
)


class ResumeMismatch(ValueError):
    """Resuming a run whose stored config differs on run-changing keys; str() lists them."""


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


def differing_keys(
    stored: dict[str, Any], current: dict[str, Any], defaults: dict[str, Any] | None = None
) -> list[str]:
    """'key: stored -> current' for every run-changing key whose value differs. A key the stored
    config lacks (added to sparrow after the run started) differs only when the current value is
    not its default (`defaults`, the config schema's): a run dir from an older sparrow resumes."""
    old, new, default = flatten(stored), flatten(current), flatten(defaults or {})
    # An older sparrow stored paths as typed: a relative one meant the current directory.
    old |= {k: absolute_path(k, old[k]) for k in PATH_KEYS if k in old}
    keys = sorted(k for k in old.keys() | new.keys() if k.startswith(RUN_KEYS))
    keys = [k for k in keys if k in old or k not in default or new.get(k) != default[k]]
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def absolute_path(key: str, value: Any) -> Any:
    """`value` of `key` (one of PATH_KEYS) with the path of an existing local file or directory
    made absolute from the current directory; anything else as it is: a hub dataset, the
    embedded "tasks", a package.module:function, None, and a missing file (whose error then names
    it as the user typed it)."""
    if not isinstance(value, str):
        return value
    if key == "rl.reward.function":
        # A file is what sparrow/tasks/user_reward.py imports as one: it ends in .py or has a '/'.
        source, colon, name = value.rpartition(":")
        path = os.path.expanduser(source)
        if colon and (source.endswith(".py") or "/" in source) and os.path.exists(path):
            return f"{os.path.abspath(path)}:{name}"
        return value
    path = os.path.expanduser(value)
    return os.path.abspath(path) if is_local(value) and os.path.exists(path) else value


def check_resume(
    run_dir: Path,
    config: dict[str, Any],
    allow: bool,
    checkpoint: Path,
    defaults: dict[str, Any] | None = None,
) -> None:
    """Raise ResumeMismatch when resuming `checkpoint` would silently change the run
    (`defaults`: the schema's values, for keys newer than the stored config)."""
    path = Path(run_dir) / FILE_NAME
    if allow or not path.is_file():
        return
    diffs = differing_keys(json.loads(path.read_text()), config, defaults)
    if diffs:
        raise ResumeMismatch(
            f"{run_dir} holds a run with another config ({'; '.join(diffs)}); resuming "
            f"{checkpoint.name} would mix the two. Use another run_dir, resume=never to start "
            "afresh here, or resume_mismatch=allow to resume anyway"
        )


def save_run_config(run_dir: Path, config: dict[str, Any]) -> None:
    path = Path(run_dir) / FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config, indent=1, default=str))
    os.replace(tmp, path)
