"""The engine's sleep (rollout/sleep.py): what it frees is gone while asleep (the pool's tensors
dead, the weights' storage empty, the host RSS down by the pool's size) and waking gives the
generations of an engine that never slept, bit for bit, at both levels."""

import gc
import weakref

import pytest
import torch

from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams

PARAMS = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)


def _engine(model, tokenizer, num_pages: int = 64) -> LLMEngine:
    engine = LLMEngine(model, tokenizer, EngineConfig(page_size=16, num_pages=num_pages, seed=3))
    engine.set_schedule(lambda context: 2)  # sparse past 2 pages: summaries are read
    return engine


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (70, 45)]


def _same(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert torch.equal(x.logprobs, y.logprobs)


@pytest.mark.parametrize("level", ["kv", "weights"])
def test_wake_generates_what_a_never_sleeping_engine_does(lively_llama, level):
    model, tokenizer = lively_llama.model, lively_llama.tokenizer
    prompts = _prompts(model.config.vocab_size)
    awake, slept = _engine(model, tokenizer), _engine(model, tokenizer)
    _same(awake.generate(prompts, PARAMS, n=3), slept.generate(prompts, PARAMS, n=3))
    slept.sleep(level)
    assert slept.asleep
    if level == "weights":  # the trainer's weight sync, which wakes it
        with pytest.raises(RuntimeError, match="push the actor's weights"):
            slept.generate(prompts, PARAMS, n=3)
        slept.update_weights(model.state_dict())
    second = slept.generate(prompts, PARAMS, n=3)  # a generate wakes the cache itself
    assert not slept.asleep
    _same(awake.generate(prompts, PARAMS, n=3), second)


def test_sleep_frees_the_pool_and_the_weights(lively_llama):
    model, tokenizer = lively_llama.model, lively_llama.tokenizer
    engine = _engine(model, tokenizer)
    engine.generate(_prompts(model.config.vocab_size), PARAMS, n=2)
    kv = engine.runner.kv
    held = [weakref.ref(t) for t in (kv.k, kv.v, kv._summary.k_min, kv._summary.k_max)]
    del kv
    engine.sleep("kv")
    gc.collect()
    assert [r() for r in held] == [None] * len(held), "the pool's tensors outlive the sleep"
    with pytest.raises(RuntimeError, match="asleep"):
        engine.runner.kv  # noqa: B018
    assert engine.runner.model.embed.untyped_storage().nbytes() > 0  # kv keeps the weights
    engine.sleep("weights")
    weights = engine.runner.model.weight_tensors()
    assert all(w.untyped_storage().nbytes() == 0 for w in weights)
    with pytest.raises(ValueError, match="lacks"):  # a partial push cannot refill them
        engine.update_weights({"model.norm.weight": model.state_dict()["model.norm.weight"]})
    engine.update_weights(model.state_dict())
    assert all(w.untyped_storage().nbytes() > 0 for w in weights)


def _rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_sleep_returns_the_pool_to_the_os(lively_llama):
    model, tokenizer = lively_llama.model, lively_llama.tokenizer
    engine = _engine(model, tokenizer, num_pages=16384)
    kv = engine.runner.kv
    kv.k.fill_(1.0), kv.v.fill_(1.0)  # touched: resident, as after a long rollout
    pool = kv.k.nbytes + kv.v.nbytes
    del kv
    before = _rss()
    engine.sleep("kv")
    gc.collect()
    freed = before - _rss()
    assert freed > 0.9 * pool, f"RSS fell by {freed / 2**20:.0f} MiB, the pool is {pool / 2**20}"
    engine.wake()
    assert engine.runner.kv.k.abs().sum() == 0  # re-allocated empty, as a new engine's
