"""The model families sparrow runs and what each needs of an HF config: the one list the engine
(sparrow.rollout.model), the model shape (shape.py, hence the memory plan) and the tiny debug
models (loading.py) read.

    family = check_family(config, context_tokens=4096)  # ValueError, one line, when refused

All four are Llama-style decoders (RMSNorm, RoPE, GQA, bias-free SwiGLU MLP, tied or separate
LM head); they differ in q/k norms, attention biases and sliding windows. Sparrow attends over the
whole context, so a sliding window is refused unless it never cuts anything: off (Qwen2/Qwen3's
`use_sliding_window: false`), or for Mistral a `sliding_window` of at least the run's context
and of each engine call's longest sequence (`check_window`; the engine API holds no prompt to the
model's positions, which the CLIs' context is).
The dense actor runs the HF model itself, which handles every family here.
Attributes are read, nothing is imported from transformers.
"""

import difflib
from dataclasses import dataclass

# Where a family's attention biases come from.
BIAS_FROM_CONFIG = "attention_bias"  # q/k/v and o biases when the config's attention_bias is set
BIAS_QKV = "qkv"  # always on q/k/v, never on o (Qwen2)
BIAS_NONE = "none"  # never (Mistral)

# Which sliding-window setting a family's configs carry.
WINDOW_SWITCH = "use_sliding_window"  # must be false (Qwen2, Qwen3)
WINDOW_SIZE = "sliding_window"  # null, or at least the run's context (Mistral)


@dataclass(frozen=True)
class Family:
    model_type: str  # the HF config's model_type
    qk_norm: bool  # RMSNorm over each q and k head before RoPE (Qwen3)
    biases: str  # BIAS_FROM_CONFIG | BIAS_QKV | BIAS_NONE
    window: str | None  # WINDOW_SWITCH | WINDOW_SIZE | None (no sliding window exists)


# What each family needs beyond the common decoder (bias-free SwiGLU MLP, hidden_act silu; RoPE
# default, linear, llama3 or yarn: sparrow.rollout.rope).
FAMILIES = {
    f.model_type: f
    for f in (
        # Llama 2/3: nothing more; attention_bias is read.
        Family("llama", qk_norm=False, biases=BIAS_FROM_CONFIG, window=None),
        # Mistral 7B v0.2/v0.3 (sliding_window: null); v0.1's 4,096-token window only for runs
        # whose context fits in it.
        Family("mistral", qk_norm=False, biases=BIAS_NONE, window=WINDOW_SIZE),
        # Qwen2, Qwen2.5(-Math), DeepSeek-R1-Distill-Qwen: use_sliding_window: false (as shipped).
        Family("qwen2", qk_norm=False, biases=BIAS_QKV, window=WINDOW_SWITCH),
        # Qwen3 dense: use_sliding_window: false (as shipped).
        Family("qwen3", qk_norm=True, biases=BIAS_FROM_CONFIG, window=WINDOW_SWITCH),
    )
}


def closest_family(model_type: str) -> str:
    """The supported family whose name is nearest `model_type` (`qwen2_moe` -> qwen2)."""
    prefixed = [name for name in FAMILIES if str(model_type).startswith(name)]
    if prefixed:
        return max(prefixed, key=len)
    return difflib.get_close_matches(str(model_type), list(FAMILIES), n=1, cutoff=0.0)[0]


def attention_biases(config) -> tuple[bool, bool]:
    """(q/k/v biases, o bias) of a config; a config of no listed family reads attention_bias."""
    family = FAMILIES.get(getattr(config, "model_type", ""))
    biases = family.biases if family else BIAS_FROM_CONFIG
    if biases == BIAS_QKV:
        return True, False
    if biases == BIAS_NONE:
        return False, False
    bias = bool(getattr(config, "attention_bias", False))
    return bias, bias


def check_family(config, context_tokens: int | None = None, context_from: str = "") -> Family:
    """The config's family, or a one-line ValueError naming the setting that refuses it.

    `context_tokens`: the longest sequence the run can hold, set by `context_from` (the keys, for
    the message); a Mistral `sliding_window` is checked against it (None: not checked)."""
    model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(str(model_type))
    if family is None:
        raise ValueError(
            f"model_type {model_type!r} not supported; the closest supported family is "
            f"{closest_family(str(model_type))!r} (supported: {', '.join(FAMILIES)})"
        )
    if getattr(config, "mlp_bias", False) or getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(
            f"{model_type}: only bias-free SwiGLU MLPs (hidden_act='silu', no mlp_bias) "
            f"are supported, got hidden_act={getattr(config, 'hidden_act', None)!r}"
        )
    layer_types = getattr(config, "layer_types", None) or ()
    if getattr(config, "use_sliding_window", False) or "sliding_attention" in layer_types:
        raise ValueError(
            f"{model_type}: use_sliding_window=true is not supported (sparrow attends over the "
            "whole context): set use_sliding_window: false in the model's config.json"
        )
    if context_tokens is not None:
        source = f" ({context_from})" if context_from else ""
        context = f"the run's {context_tokens}-token context{source}"
        check_window(config, context_tokens, context, fits="a context of")
    return family


def check_window(config, context_tokens: int, context: str, fits: str) -> None:
    """A one-line ValueError when the config's sliding window (a Mistral `sliding_window`) is
    shorter than `context_tokens`: HF attends over only the window's last tokens there, sparrow
    over all of them. `context` says what holds the tokens and `fits` what must fit the window
    instead (the message ends "or {fits} at most {window} tokens"). The engine checks its
    construction's context (check_family) and each call's longest sequence with it."""
    family = FAMILIES.get(str(getattr(config, "model_type", None)))
    if family is None or family.window != WINDOW_SIZE:
        return
    window = getattr(config, "sliding_window", None)
    if window is not None and window < context_tokens:
        raise ValueError(
            f"{config.model_type}: sliding_window={window} is shorter than {context}, and "
            f"sparrow attends over the whole context: use a checkpoint with sliding_window: "
            f"null, or {fits} at most {window} tokens"
        )
