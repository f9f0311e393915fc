"""LLMEngine.score on the rows of GRPO groups: each distinct prompt is prefilled once and its
pages are shared by the rows that replay it, with the same logits as scoring every row alone."""

import pytest
from tiny_lm import random_prompts

from sparrow.rollout.engine import EngineConfig, LLMEngine


def make_engine(lm, **overrides):
    cfg = EngineConfig(**{"page_size": 4, "num_pages": 128, **overrides})
    return LLMEngine(lm.model, lm.tokenizer, cfg)


def sparse(context_tokens: int) -> int:
    return 3  # pages of 4 tokens: decodes read 3 of them once the context passes 12 tokens


@pytest.mark.parametrize("lm_name", ["lively_llama", "tiny_qwen3"])
def test_repeated_prompts_prefill_once_and_score_as_alone(lm_name, request):
    lm = request.getfixturevalue(lm_name)
    engine = make_engine(lm)
    vocab = engine.runner.model.shape.vocab_size
    prompt_a, prompt_b = random_prompts(vocab, [18, 9], seed=12)  # A: 4 full pages + 2 tokens
    completions = random_prompts(vocab, [7, 3, 10, 1, 6], seed=13)
    # Two groups, interleaved, one row dense among sparse ones.
    prompts = [prompt_a, prompt_b, prompt_a, prompt_b, prompt_a]
    schedules = [sparse, sparse, None, sparse, sparse]
    prefill_tokens = []
    prefill = engine.runner.model.prefill

    def counting_prefill(ids, *args, **kwargs):
        prefill_tokens.append(ids.numel())
        return prefill(ids, *args, **kwargs)

    engine.runner.model.prefill = counting_prefill
    shared = engine.score(prompts, completions, schedules)
    del engine.runner.model.prefill
    assert prefill_tokens == [18 + 9]  # one prefill, each prompt once
    for i, (p, c, s) in enumerate(zip(prompts, completions, schedules, strict=True)):
        alone = engine.score([p], [c], [s])[0]  # (len(c), V)
        assert shared[i].shape == alone.shape == (len(c), vocab)
        # Batch size changes the GEMMs' blocking and so the rounding: up to 1.0e-5 on an AVX-512
        # host for this model's logits, far below the sparse-vs-dense gap (> 1e-3) checked below.
        assert (shared[i] - alone).abs().max() <= 3e-5
    dense_a = engine.score([prompt_a], [completions[0]], [None])[0]
    assert (shared[0] - dense_a).abs().max() > 1e-3  # the sparse schedule applied per row
