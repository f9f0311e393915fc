"""Shapes padded to buckets (what CUDA-graph replay needs) decode exactly like unpadded eager.

On CPU the engine never pads (it pads only with `cuda_graphs`), so these tests turn the plan's
padding on directly: batch rows, page columns and selection counts are rounded up, padding rows
decode a one-token sequence on the scratch page, and the outputs must not change.
"""

import pytest
import torch
from tiny_lm import random_prompts

from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams

PARAMS = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)


def engine_for(lm, backend: str, dtype: str, pad: bool) -> tuple[LLMEngine, list]:
    cfg = EngineConfig(page_size=4, num_pages=96, backend=backend, dtype=dtype, seed=3)
    engine = LLMEngine(lm.model, lm.tokenizer, cfg, schedule=lambda ctx: 4)  # 16 tokens
    engine.runner.plan.pad_shapes = pad
    shapes = []
    update = engine.runner.plan.update

    def recorded(seqs, budgets):
        step = update(seqs, budgets)
        shapes.append((len(seqs), *step.page_table.shape, step.max_selected, step.max_top))
        return step

    engine.runner.plan.update = recorded
    return engine, shapes


@pytest.mark.parametrize(
    "backend, dtype",
    [("torch", "float32"), ("torch", "bfloat16"), ("auto", "float32")],
)
def test_padded_shapes_give_the_unpadded_tokens_and_logprobs(lively_llama, backend, dtype):
    vocab = lively_llama.model.config.vocab_size
    prompts = random_prompts(vocab, [23, 9, 14], seed=2)  # 3 prompts x 2 samples: 6 -> 8 rows
    plain, plain_shapes = engine_for(lively_llama, backend, dtype, pad=False)
    padded, padded_shapes = engine_for(lively_llama, backend, dtype, pad=True)
    ref = plain.generate(prompts, PARAMS, n=2)
    got = padded.generate(prompts, PARAMS, n=2)
    # Padding happened: more rows, columns or selection slots than the batch needs.
    assert any(p[1] > p[0] for p in padded_shapes)
    assert any(p[1:] != q[1:] for p, q in zip(padded_shapes, plain_shapes, strict=True))
    assert all(p[0] == p[1] for p in plain_shapes)
    for a, b in zip(got, ref, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-5)
        assert torch.equal(a.budget_pages, b.budget_pages)
