"""Random-weight models with the shapes of real ones (Qwen3-1.7B/4B/8B), for GPU benchmarks
without a hub download.

    python -m sparrow.models.random_init qwen3-1.7b /tmp/q17b   # config, weights, tokenizer

The saved directory loads like any HF checkpoint (`model.name=<dir>`). Timing depends on shapes,
not on values, so a random Qwen3-1.7B-shaped model costs what the real one costs per token; its
outputs are noise, so benchmarks generate fixed lengths (ignore EOS). The vocabulary is the real
one (151,936: the LM head is a large share of a small model's decode); the tokenizer is the
tiny local BPE (sparrow.models.loading), so prompts tokenize offline and sampled ids it lacks
decode to nothing.
`qwen3-debug` is the tiny Qwen3 (sparrow.models.loading.tiny_model_config, 3 layers, 1,024 ids)
through the same path, for CPU tests.
"""

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM

from sparrow.models.loading import (
    TINY_SPECIAL_TOKENS,
    LoadedModel,
    tiny_model_config,
    tiny_tokenizer,
)

# From the public Qwen3 configs (hidden, MLP width, layers, query heads, KV heads, tied embeddings).
QWEN3_SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-1.7b": dict(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    ),
    "qwen3-4b": dict(
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    ),
    "qwen3-8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    ),
}
QWEN3_COMMON: dict[str, Any] = dict(
    vocab_size=151936,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    bos_token_id=None,
    eos_token_id=TINY_SPECIAL_TOKENS.index("<|im_end|>"),  # the tiny tokenizer's ids
    pad_token_id=TINY_SPECIAL_TOKENS.index("<|endoftext|>"),
)


RANDOM_MODELS = sorted([*QWEN3_SHAPES, "qwen3-debug"])


def random_model_config(name: str) -> transformers.PretrainedConfig:
    if name == "qwen3-debug":
        return tiny_model_config(
            "qwen3", vocab_size=1024, num_hidden_layers=3, max_position_embeddings=40960
        )
    if name not in QWEN3_SHAPES:
        raise ValueError(f"unknown random model {name!r}: expected one of {RANDOM_MODELS}")
    return transformers.Qwen3Config(**(QWEN3_COMMON | QWEN3_SHAPES[name]))


def build_random_model(
    name: str, dtype: torch.dtype = torch.bfloat16, seed: int = 0, device: str = "cpu"
) -> LoadedModel:
    """The model initialised (seeded) on `device`, in eval mode, with the tiny tokenizer."""
    config = random_model_config(name)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return LoadedModel(model.eval(), tiny_tokenizer())


def save_random_model(
    name: str, directory: str | Path, dtype: str = "bfloat16", seed: int = 0
) -> Path:
    """Write config + safetensors + tokenizer to `directory` (reused if already complete).

    Initialised on the GPU when there is one: a 1.7B-8B init on CPU takes tens of seconds.
    """
    directory = Path(directory)
    if (directory / "config.json").is_file() and any(directory.glob("*.safetensors")):
        return directory
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loaded = build_random_model(name, getattr(torch, dtype), seed, device)
    directory.mkdir(parents=True, exist_ok=True)
    loaded.model.save_pretrained(directory, safe_serialization=True)
    loaded.tokenizer.save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sparrow.models.random_init", description=__doc__)
    p.add_argument("name", choices=RANDOM_MODELS)
    p.add_argument("directory")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(save_random_model(args.name, args.directory, args.dtype, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
