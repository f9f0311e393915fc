"""A model's HF config without its weights: what a dry run plans memory from.

    config, source = read_model_config(cfg.model)

In order: the tiny debug models' configs; a local directory's or the HF cache's config.json
(never the network); the configs shipped in hf_configs/ for the models the GPU presets and the
README name (Qwen3 1.7B/4B/8B, Qwen2.5-Math-1.5B-Instruct, DeepSeek-R1-Distill-Qwen-1.5B: the
hub's config.json, values checked against published copies of it), matched by hub id or its
last part.
"""

import json
from pathlib import Path

import transformers

from sparrow.models.loading import (
    SMOLLM2,
    TINY_FAMILIES,
    ModelConfig,
    cache_root,
    tiny_model_config,
)

SHIPPED = Path(__file__).with_name("hf_configs")


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.json"))


def read_model_config(cfg: ModelConfig) -> tuple[transformers.PretrainedConfig, str]:
    """(config, where it was read); ValueError naming model.name when there is none."""
    if cfg.name in TINY_FAMILIES:
        return tiny_model_config(TINY_FAMILIES[cfg.name]), "built in"
    path = cache_root(cfg.cache_dir) / "models" / SMOLLM2 if cfg.name == SMOLLM2 else cfg.name
    try:
        config = transformers.AutoConfig.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=cfg.trust_remote_code
        )
        return config, str(path)
    except (OSError, ValueError):
        pass  # not on disk: a shipped config, if there is one
    shipped = SHIPPED / f"{str(cfg.name).rstrip('/').split('/')[-1]}.json"
    if not shipped.is_file():
        raise ValueError(
            f"model.name={cfg.name!r}: no config.json on disk or in the HF cache, and none "
            f"shipped (sparrow/models/hf_configs: {', '.join(shipped_names())})"
        )
    fields = json.loads(shipped.read_text())
    return transformers.AutoConfig.for_model(**fields), f"shipped {shipped.name}"
