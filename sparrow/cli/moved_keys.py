"""Config keys sparrow no longer has, each with the key that holds its value now (issue 48: each
knob is set in one place and passed down, so nothing can disagree).

An override naming one stops in one line naming the new key. A run config stored by an older
sparrow (run_config.json) loses them when read: their values were the new keys' own, since the
loader of that time refused any run in which the two differed.
"""

MOVED = {
    "schedule.page_size": "rollout.engine.page_size",  # the engine's pages; budgets count them
    "monitor.bin_tokens": "schedule.bin_tokens",  # the monitor bins as the schedule does
    "monitor.top_k": "rollout.engine.topk_logprobs",  # the top-K the engine records
}


def moved_key_error(overrides: list[str]) -> str | None:
    """The one line for the first override that sets a moved key; None when none does."""
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key in MOVED:
            return f"{key} is gone: the value is {MOVED[key]}'s alone; set {MOVED[key]}"
    return None


def without_moved_keys(tree: dict) -> dict:
    """A copy of a stored config tree (nested dicts) without the moved keys."""
    out = {key: dict(value) if isinstance(value, dict) else value for key, value in tree.items()}
    for dotted in MOVED:
        section, key = dotted.split(".")
        if isinstance(out.get(section), dict):
            out[section].pop(key, None)
    return out
