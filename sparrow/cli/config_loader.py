"""Hydra composition of conf/ into a typed SparrowConfig, with one-line errors for bad input.

The structured schema (sparrow/train/config.py) is registered as `sparrow_schema`, so a mistyped
key or a value of the wrong type fails composition; the message names the key. This is the only
place that turns a DictConfig into dataclasses.
"""

import os
from pathlib import Path

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from sparrow.cli.errors import UserError
from sparrow.train.config import SparrowConfig


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
    ConfigStore.instance().store(name="sparrow_schema", node=SparrowConfig)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            return compose(config_name, overrides=overrides)
    except yaml.YAMLError as err:  # a broken file under conf/: the message names it and the line
        raise ConfigError(f"malformed YAML: {' '.join(str(err).split())}") from err
    # Hydra reports some malformed overrides (e.g. "=3") as a plain ValueError.
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        raise ConfigError(_one_line(err)) from err


def load_config(overrides: list[str]) -> SparrowConfig:
    cfg = compose_dict(overrides)
    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as err:  # e.g. a mandatory value (???) left unset
        raise ConfigError(_one_line(err)) from err
    except ValueError as err:  # a config dataclass's __post_init__ rejected a value
        raise ConfigError(str(err)) from err


def _one_line(err: BaseException) -> str:
    parts = []
    while err is not None:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if first not in parts:
            parts.append(first)
        err = err.__cause__
    return ": ".join(parts)
