"""The family list (sparrow.models.families): what each family's shape reads, the memory plan's
parameter count against the HF models, and the one-line refusals."""

import pytest
import torch
import transformers

from sparrow.models.families import FAMILIES, check_family, check_window, closest_family
from sparrow.models.loading import ModelConfig, tiny_model_config
from sparrow.models.model_config import read_model_config
from sparrow.models.shape import ModelShape
from sparrow.train.memory.plan import parameter_count

VARIANTS = {
    "qwen2": tiny_model_config("qwen2"),
    "qwen2-untied": tiny_model_config("qwen2", tie_word_embeddings=False),
    "mistral": tiny_model_config("mistral"),
    "mistral-untied": tiny_model_config("mistral", tie_word_embeddings=False),
    "llama-bias": tiny_model_config("llama", attention_bias=True),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parameter_count_is_the_models(name):
    config = VARIANTS[name]
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    shape = ModelShape.from_hf_config(config)
    assert parameter_count(shape) == sum(p.numel() for p in model.parameters())
    attn = model.model.layers[0].self_attn
    assert shape.qkv_bias == (attn.q_proj.bias is not None) == (attn.v_proj.bias is not None)
    assert shape.o_bias == (attn.o_proj.bias is not None)
    assert shape.tied_embeddings == config.tie_word_embeddings


def test_qwen2_has_qkv_biases_without_an_o_bias_and_no_qk_norm():
    s = ModelShape.from_hf_config(tiny_model_config("qwen2"))
    assert (s.qkv_bias, s.o_bias, s.qk_norm) == (True, False, False)
    s = ModelShape.from_hf_config(tiny_model_config("mistral"))
    assert (s.qkv_bias, s.o_bias, s.qk_norm) == (False, False, False)


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-mistral"])
def test_tiny_families_have_configs_a_dry_run_reads(name):
    config, source = read_model_config(ModelConfig(name))
    assert source == "built in" and config.model_type == name.removeprefix("tiny-")
    assert check_family(config, context_tokens=1 << 20).model_type == config.model_type


def test_qwen2_with_its_sliding_window_on_is_refused_in_one_line():
    config = tiny_model_config("qwen2", use_sliding_window=True, sliding_window=64)
    with pytest.raises(ValueError, match=r"^qwen2: use_sliding_window=true is not supported") as e:
        check_family(config)
    assert "\n" not in str(e.value) and "use_sliding_window: false" in str(e.value)
    off = tiny_model_config("qwen2", use_sliding_window=False, sliding_window=64)
    assert check_family(off, context_tokens=4096).model_type == "qwen2"  # the window is unused


def test_mistral_window_is_checked_against_the_context():
    config = tiny_model_config("mistral", sliding_window=4096)
    check_family(config, context_tokens=4096)
    check_family(config)  # no context known: nothing to check it against
    with pytest.raises(ValueError, match=r"^mistral: sliding_window=4096 .* 4097-token context"):
        check_family(config, context_tokens=4097)


def test_check_window_names_what_holds_the_tokens_and_what_must_fit():
    """The one window check, shared by check_family and the engine's calls: only a Mistral's
    window refuses, and only a context over it."""
    config = tiny_model_config("mistral", sliding_window=64)
    check_window(config, 64, "unused", fits="unused")
    with pytest.raises(ValueError) as e:
        check_window(
            config, 65, "the 65 tokens of prompt 0 (60) + its max_tokens (5)", "a prompt of"
        )
    assert str(e.value) == (
        "mistral: sliding_window=64 is shorter than the 65 tokens of prompt 0 (60) + its "
        "max_tokens (5), and sparrow attends over the whole context: use a checkpoint with "
        "sliding_window: null, or a prompt of at most 64 tokens"
    )
    for unwindowed in (
        tiny_model_config("mistral"),  # sliding_window: null
        tiny_model_config("qwen2", use_sliding_window=False, sliding_window=64),  # switched off
        tiny_model_config("llama"),
    ):
        check_window(unwindowed, 1 << 20, "unused", fits="unused")


@pytest.mark.parametrize(
    "model_type, closest",
    [("qwen2_moe", "qwen2"), ("qwen3_moe", "qwen3"), ("mixtral", "mistral"), ("llama4", "llama")],
)
def test_unknown_family_is_refused_naming_the_closest(model_type, closest):
    assert closest_family(model_type) == closest
    config = transformers.PretrainedConfig()
    config.model_type = model_type
    with pytest.raises(ValueError, match=f"closest supported family is '{closest}'") as e:
        check_family(config)
    assert str(e.value).startswith(f"model_type '{model_type}' not supported")
    assert all(name in str(e.value) for name in FAMILIES) and "\n" not in str(e.value)


def test_non_swiglu_mlp_is_refused():
    with pytest.raises(ValueError, match="hidden_act='silu'"):
        check_family(tiny_model_config("mistral", hidden_act="gelu"))
