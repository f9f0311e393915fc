"""The engine on CUDA (Triton kernels through backend="auto"): skipped without a GPU."""

import pytest
import torch
from tiny_lm import random_prompts

from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams

pytestmark = pytest.mark.gpu


def test_cuda_engine_matches_transformers_and_runs_sparse(lively_llama):
    model = lively_llama.model.to("cuda")
    try:
        engine = LLMEngine(model, lively_llama.tokenizer, EngineConfig(page_size=4, num_pages=64))
        vocab = model.config.vocab_size
        prompts, completions = random_prompts(vocab, [37, 9]), random_prompts(vocab, [20, 20], 1)
        dense = engine.score(prompts, completions)
        for got, p, c in zip(dense, prompts, completions, strict=True):
            with torch.no_grad():
                ref = model(torch.tensor([p + c], device="cuda")).logits[0].float()
            assert (got - ref[len(p) - 1 : -1]).abs().max().item() <= 1e-3
        engine.set_schedule(lambda context_tokens: 4)
        sparse = engine.score(prompts, completions)
        assert not torch.allclose(sparse[0], dense[0], atol=1e-3)
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        big = engine.generate(prompts, params, n=2)
        small_engine = LLMEngine(
            model, lively_llama.tokenizer, EngineConfig(page_size=4, num_pages=16)
        )
        small_engine.set_schedule(lambda context_tokens: 4)
        small = small_engine.generate(prompts, params, n=2)
        assert all(len(o.token_ids) == 24 for o in small)
        assert small_engine.last_stats.num_preemptions > 0
        assert all(o.budget_pages.max() <= 16 for o in big)
    finally:
        model.to("cpu")
