"""Hydra composition of conf/ into a typed SparrowConfig, with one-line errors for bad input.

The structured schema (sparrow/train/config.py) is registered as `sparrow_schema`, so a mistyped
key or a value of the wrong type fails composition; the message names the key. An override Hydra
cannot parse for want of quotes (a run dir with spaces split by the shell) gets the quoted form
that works. This is the only place that turns a DictConfig into dataclasses.
"""

import json
import os
import re
import shlex
from pathlib import Path
from typing import cast

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from sparrow.cli.errors import UserError
from sparrow.cli.moved_keys import moved_key_error, without_moved_keys
from sparrow.train.config import SparrowConfig
from sparrow.train.run.stored_config import PATH_KEYS, absolute_path


class ConfigError(UserError):
    """A config that does not compose or validate; str() is one line naming the key."""


def conf_dir() -> Path:
    """conf/ of the checkout, or $SPARROW_CONF."""
    path = Path(os.environ.get("SPARROW_CONF", Path(__file__).resolve().parents[2] / "conf"))
    if not (path / "config.yaml").is_file():
        raise ConfigError(f"no config.yaml in {path} (set SPARROW_CONF to the conf/ directory)")
    return path


def compose_dict(overrides: list[str], config_name: str = "config"):
    """The composed DictConfig (validated against the schema), for printing."""
    hydra_keys = [o for o in overrides if o.lstrip("+~").startswith("hydra.")]
    if hydra_keys:  # composed without Hydra's app runner: hydra.* would be silently ignored
        raise ConfigError(
            f"{hydra_keys[0].split('=')[0]} is not used by sparrow: set run_dir=PATH for the "
            "output directory"
        )
    moved = moved_key_error(overrides)
    if moved:  # Hydra would say only that the key is not in the schema
        raise ConfigError(moved)
    overrides = [python_key(o) for o in overrides]
    ConfigStore.instance().store(name="sparrow_schema", node=SparrowConfig)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            return compose(config_name, overrides=overrides)
    except yaml.YAMLError as err:  # a broken file under conf/: the message names it and the line
        raise ConfigError(f"malformed YAML: {' '.join(str(err).split())}") from err
    # Hydra reports some malformed overrides (e.g. "=3") as a plain ValueError.
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        raise ConfigError(_quoting_hint(err, overrides) or _one_line(err)) from err


# Keys users type whose dataclass field cannot be named so (a Python keyword) -> the field.
KEYWORD_KEYS = {"rl.async": "rl.async_rollout"}


def python_key(override: str) -> str:
    """`override` with a keyword key rewritten to its field (`rl.async.staleness=1` ->
    `rl.async_rollout.staleness=1`); other overrides unchanged."""
    prefix = override[: len(override) - len(override.lstrip("+~"))]
    body = override[len(prefix) :]
    for typed, field_key in KEYWORD_KEYS.items():
        if body == typed or body.startswith((typed + ".", typed + "=")):
            return prefix + field_key + body[len(typed) :]
    return override


def load_config(overrides: list[str]) -> SparrowConfig:
    """The composed, validated config, its local paths (PATH_KEYS) made absolute as the run dir
    stores them."""
    cfg = compose_dict(overrides)
    try:  # a structured SparrowConfig tree: to_object builds its dataclass
        return _absolute_paths(cast(SparrowConfig, OmegaConf.to_object(cfg)))
    except OmegaConfBaseException as err:  # e.g. a mandatory value (???) left unset
        raise ConfigError(_one_line(err)) from err
    except ValueError as err:  # a config dataclass's __post_init__ rejected a value
        raise ConfigError(str(err)) from err


def _absolute_paths(cfg: SparrowConfig) -> SparrowConfig:
    for key in PATH_KEYS:
        *parents, name = key.split(".")
        owner = cfg
        for parent in parents:
            owner = getattr(owner, parent)
        setattr(owner, name, absolute_path(key, getattr(owner, name)))
    return cfg


def load_stored_config(path: Path) -> SparrowConfig:
    """The config a run dir stored (`run_config.json`, sparrow/train/run/stored_config.py),
    checked against today's schema; its `resume` is dropped (reading a run never resumes it)."""
    try:
        tree = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not a readable run config ({_one_line(err)})") from err
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: not a run config (a JSON object)")
    tree = without_moved_keys(tree)  # an older sparrow's copies of a shared knob
    tree["resume"] = "never"
    try:
        merged = OmegaConf.merge(OmegaConf.structured(SparrowConfig), tree)
        return cast(SparrowConfig, OmegaConf.to_object(merged))
    except OmegaConfBaseException as err:  # a key today's schema lacks, or a wrong type
        raise ConfigError(f"{path} does not fit this sparrow's config: {_one_line(err)}") from err
    except ValueError as err:
        raise ConfigError(f"{path}: {err}") from err


def _quoting_hint(err: BaseException, overrides: list[str]) -> str | None:
    """The one line for an override Hydra cannot parse because a value was not quoted: one that
    the shell split at a space (`run_dir=/tmp/my runs/x` arrives as two arguments) or one whose
    value holds characters Hydra's grammar reserves; None for other errors."""
    if not isinstance(err, OverrideParseException) or err.override not in overrides:
        return None
    why = err.message.splitlines()[1 if err.message.startswith("Error parsing") else 0]
    i = overrides.index(err.override)
    split = "=" not in err.override and not _is_key(err.override)  # not a forgotten =value
    if split and i > 0 and "=" in overrides[i - 1]:
        rest = [err.override]
        for more in overrides[i + 1 :]:
            if "=" in more:
                break
            rest.append(more)
        key, value = overrides[i - 1].split("=", 1)
        value = " ".join([value, *rest])
    elif "=" in err.override:
        key, value = err.override.split("=", 1)
    else:
        return None
    if not value or value[0] in "[{'\"":  # a list, a dict or already quoted: not this mistake
        return None
    return (
        f"cannot parse override {err.override!r} ({why}): a value with spaces or special "
        f"characters must be quoted for the shell and for Hydra, e.g. "
        f"{shlex.quote(f'{key}={_hydra_quoted(value)}')}"
    )


def _is_key(text: str) -> bool:
    """Whether `text` names a key of the schema (e.g. `rl.steps`) or a group of conf/."""
    key = text.lstrip("+~")
    if (conf_dir() / key).is_dir():
        return True
    absent = object()
    try:
        schema = OmegaConf.structured(SparrowConfig)
        return OmegaConf.select(schema, key, default=absent) is not absent
    except OmegaConfBaseException:
        return False


def _hydra_quoted(value: str) -> str:
    """`value` as a quoted string of Hydra's override grammar (a backslash escapes the quote, and
    backslashes before a quote or at the end are doubled)."""
    quote = "'" if '"' in value and "'" not in value else '"'
    escaped = re.sub(rf"(\\\\*)(?={quote}|$)", r"\1\1", value).replace(quote, "\\" + quote)
    return f"{quote}{escaped}{quote}"


def _one_line(err: BaseException | None) -> str:
    parts = []
    while err is not None:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if first not in parts:
            parts.append(first)
        err = err.__cause__
    return ": ".join(parts)
