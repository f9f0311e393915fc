"""Sparrow's forward vs transformers': teacher-forced logits through prefill + paged decode."""

import pytest
import torch
import transformers
from tiny_lm import random_model, random_prompts

from sparrow.models.loading import tiny_model_config
from sparrow.rollout.engine import EngineConfig, LLMEngine
from sparrow.rollout.rope import rope_from_config


def hf_logits(model, prompt, completion):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]  # (T, V)


def max_diff_vs_hf(engine, model, prompts, completions):
    got = engine.score(prompts, completions)
    return max(
        (g - hf_logits(model, p, c)).abs().max().item()
        for g, p, c in zip(got, prompts, completions, strict=True)
    )


@pytest.mark.parametrize("linear_backend", ["torch", "onednn"])
@pytest.mark.parametrize("family", ["tiny_qwen3", "tiny_llama"])
def test_teacher_forced_logits_match_transformers(family, linear_backend, request):
    lm = request.getfixturevalue(family)
    vocab = lm.model.config.vocab_size
    # page_size 4: prompts end mid-page and on a page boundary, decode crosses several pages.
    cfg = EngineConfig(page_size=4, num_pages=64, linear_backend=linear_backend)
    engine = LLMEngine(lm.model, lm.tokenizer, cfg)
    prompts = random_prompts(vocab, [5, 12, 1], seed=1)
    completions = random_prompts(vocab, [23, 9, 14], seed=2)
    assert max_diff_vs_hf(engine, lm.model, prompts, completions) <= 1e-4


def test_llama3_rope_scaling_matches_transformers(tiny_llama):
    config = tiny_model_config("llama", vocab_size=tiny_llama.model.config.vocab_size)
    config.rope_parameters = {
        "rope_type": "llama3",
        "rope_theta": 10_000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,  # small, so that the bands all occur
    }
    model = random_model(config, seed=3)
    ours = rope_from_config(config, config.head_dim).inv_freq
    plain = rope_from_config(tiny_model_config("llama"), config.head_dim).inv_freq
    assert torch.allclose(ours, model.model.rotary_emb.inv_freq, rtol=1e-6, atol=0)
    assert not torch.allclose(ours, plain)  # the scaling did something
    engine = LLMEngine(model, tiny_llama.tokenizer, EngineConfig(page_size=4, num_pages=32))
    prompts = random_prompts(config.vocab_size, [20], seed=4)
    completions = random_prompts(config.vocab_size, [30], seed=5)
    assert max_diff_vs_hf(engine, model, prompts, completions) <= 1e-4


def test_unsupported_rope_type_is_refused(tiny_llama):
    config = tiny_model_config("llama")
    config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}
    with pytest.raises(ValueError, match="dynamic"):
        rope_from_config(config, 16)


@pytest.mark.parametrize("linear_backend", ["torch", "onednn"])
def test_update_weights_in_place_matches_the_new_model(tiny_qwen3, linear_backend):
    vocab = tiny_qwen3.model.config.vocab_size
    cfg = EngineConfig(page_size=4, linear_backend=linear_backend)
    engine = LLMEngine(tiny_qwen3.model, tiny_qwen3.tokenizer, cfg)
    cache_ptr = engine.runner.kv.k.data_ptr()
    other = random_model(tiny_model_config("qwen3", vocab_size=vocab), seed=7)
    prompts, completions = random_prompts(vocab, [7], seed=8), random_prompts(vocab, [6], seed=9)
    before = engine.score(prompts, completions)[0]
    # PEFT-style prefixes are accepted: base + merged LoRA weights arrive under these names.
    engine.update_weights({f"base_model.model.{k}": v for k, v in other.state_dict().items()})
    assert engine.runner.kv.k.data_ptr() == cache_ptr
    assert max_diff_vs_hf(engine, other, prompts, completions) <= 1e-4
    assert (before - engine.score(prompts, completions)[0]).abs().max() > 1e-2
    # A partial update touches only the named weights.
    name = "model.layers.0.mlp.down_proj.weight"
    engine.update_weights({name: torch.zeros_like(other.state_dict()[name])})
    assert engine.runner.model.layers[0].down.abs().max() == 0
    assert not torch.allclose(
        engine.score(prompts, completions)[0], hf_logits(other, *prompts, *completions)
    )
    with pytest.raises(KeyError, match="merge LoRA"):
        engine.update_weights({"model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(1)})


def test_unsupported_architecture_is_a_clear_error(tiny_llama):
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)
    with pytest.raises(ValueError, match="model_type 'gpt2' not supported"):
        LLMEngine(random_model(config), tiny_llama.tokenizer, EngineConfig())


def test_bfloat16_engine_tracks_fp32(tiny_llama):
    vocab = tiny_llama.model.config.vocab_size
    cfg = EngineConfig(page_size=4, num_pages=32, dtype="bfloat16")
    engine = LLMEngine(tiny_llama.model, tiny_llama.tokenizer, cfg)
    assert engine.runner.kv.k.dtype == torch.bfloat16
    prompts, completions = random_prompts(vocab, [9], seed=10), random_prompts(vocab, [8], seed=11)
    got = engine.score(prompts, completions)[0]
    ref = hf_logits(tiny_llama.model, prompts[0], completions[0])
    assert (got - ref).abs().max() < 0.1 * ref.abs().max()


def test_onednn_linear_backend_needs_float32(tiny_llama):
    cfg = EngineConfig(dtype="bfloat16", linear_backend="onednn")
    with pytest.raises(ValueError, match="float32"):
        LLMEngine(tiny_llama.model, tiny_llama.tokenizer, cfg)
