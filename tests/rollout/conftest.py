"""Tiny models shared by the rollout tests (loaded once per session: ~1 s each)."""

import pytest
import torch
import transformers

from sparrow.models.loading import LoadedModel, ModelConfig, load_model, tiny_model_config


@pytest.fixture(scope="session")
def tiny_qwen3():
    return load_model(ModelConfig("tiny-qwen3"))


@pytest.fixture(scope="session")
def tiny_llama():
    return load_model(ModelConfig("tiny-llama"))


def random_model(config: transformers.PretrainedConfig, seed: int = 0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return transformers.AutoModelForCausalLM.from_config(config).eval()


def random_prompts(vocab: int, lengths, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    # Skip the special tokens (0..2 in the tiny tokenizer) so EOS is not in prompts.
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="session")
def lively_llama(tiny_llama):
    """A tiny Llama with large random weights: greedy outputs vary with context (the default
    init repeats one token), so the engine tests can tell right from wrong KV."""
    config = tiny_model_config("llama", vocab_size=len(tiny_llama.tokenizer))
    config.initializer_range = 0.2
    return LoadedModel(random_model(config, seed=0), tiny_llama.tokenizer)
