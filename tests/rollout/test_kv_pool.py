"""KV pool exhaustion on a long-context batch: the engine preempts and every request completes.

Three 300-400-token prompts x 4 samples x 48 new tokens on a pool that holds about one group at a
time (a sample alone needs up to 28 of the 32 pages): sequences are evicted and recomputed, none
is dropped or cut short, and with dense decode the greedy outputs equal those of a pool large
enough for everything. With sparse decode the recomputed K/V come from a dense prefill (see
engine.py), so only completion is asserted there. The short-prompt case is in
tests/rollout/test_engine.py.
"""

import pytest
import torch
import transformers

from sparrow.models.loading import ModelConfig, load_model, tiny_model_config
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams

PROMPT_LENS = [310, 400, 355]
SAMPLES = 4
PARAMS = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)


@pytest.fixture(scope="module")
def lively_llama():
    """Tiny Llama with large random weights, so that greedy outputs depend on the context."""
    tokenizer = load_model(ModelConfig("tiny-llama")).tokenizer
    config = tiny_model_config("llama", vocab_size=len(tokenizer))
    config.initializer_range = 0.2
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    return model, tokenizer


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in PROMPT_LENS]


def _generate(model, tokenizer, num_pages: int, schedule=None):
    engine = LLMEngine(model, tokenizer, EngineConfig(page_size=16, num_pages=num_pages))
    engine.set_schedule(schedule)
    outs = engine.generate(_prompts(model.config.vocab_size), PARAMS, n=SAMPLES)
    return engine, outs


def _assert_all_complete(outs) -> None:
    assert len(outs) == len(PROMPT_LENS) * SAMPLES
    assert [(o.prompt_index, o.sample_index) for o in outs] == [
        (i, j) for i in range(len(PROMPT_LENS)) for j in range(SAMPLES)
    ]
    assert all(o.finish_reason == "length" and len(o.token_ids) == 48 for o in outs)
    assert all(torch.isfinite(o.logprobs).all() for o in outs)


def test_dense_long_context_batch_preempts_and_matches_a_big_pool(lively_llama):
    model, tokenizer = lively_llama
    _, big = _generate(model, tokenizer, num_pages=512)
    small_engine, small = _generate(model, tokenizer, num_pages=32)
    stats = small_engine.last_stats
    assert stats.num_preemptions > 0
    assert sum(o.num_preemptions for o in small) == stats.num_preemptions
    _assert_all_complete(small)
    assert [o.token_ids for o in small] == [o.token_ids for o in big]
    for s, b in zip(small, big, strict=True):
        assert torch.allclose(s.logprobs, b.logprobs, atol=1e-4)


def test_sparse_long_context_batch_preempts_and_completes(lively_llama):
    model, tokenizer = lively_llama
    engine, outs = _generate(model, tokenizer, num_pages=32, schedule=lambda context_tokens: 6)
    assert engine.last_stats.num_preemptions > 0
    _assert_all_complete(outs)
    # Tokens sampled from a prefill (the first one, and one per recompute) read every page;
    # every other token read the 6-page budget: the recompute did not make the rest dense.
    for o in outs:
        assert int((o.budget_pages != 6).sum()) == 1 + o.num_preemptions
