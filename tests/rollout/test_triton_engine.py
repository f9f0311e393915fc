"""The engine on the Triton backend (the GPU path: fused SwiGLU, one-launch KV append, the
Triton page choice with physical ids, split-KV decode; in bf16 also the fused norms and RoPE),
run on CPU through the interpreter, against the engine on the torch backend (the CPU path).

Sparse decode at 4-token pages with a 4-page budget, so the top-k choice, the compaction and
the physical ids are exercised at every step past 16 tokens.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from tiny_lm import random_model, random_prompts  # noqa: E402

from sparrow.kernels import decode_triton, select_triton, swiglu_triton  # noqa: E402
from sparrow.models.loading import LoadedModel, tiny_model_config  # noqa: E402
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402

if not (decode_triton.INTERPRETED and select_triton.INTERPRETED and swiglu_triton.INTERPRETED):
    pytest.skip("Triton was imported before TRITON_INTERPRET was set", allow_module_level=True)

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def lively_qwen3(tiny_qwen3):
    """Large random weights (greedy outputs follow the context, see lively_llama)."""
    config = tiny_model_config("qwen3", vocab_size=len(tiny_qwen3.tokenizer))
    config.initializer_range = 0.2
    return LoadedModel(random_model(config, seed=1), tiny_qwen3.tokenizer)


def engine(lm, backend: str, dtype: str) -> LLMEngine:
    cfg = EngineConfig(page_size=4, num_pages=64, backend=backend, dtype=dtype, seed=3)
    return LLMEngine(lm.model, lm.tokenizer, cfg, schedule=lambda ctx: 4)  # 16 tokens


@pytest.mark.parametrize("family", ["lively_llama", "lively_qwen3"])
def test_triton_engine_decodes_as_the_torch_engine_fp32(family, request):
    lm = request.getfixturevalue(family)
    prompts = random_prompts(lm.model.config.vocab_size, [23, 9], seed=4)
    triton_engine = engine(lm, "triton", "float32")
    model = triton_engine.runner.model
    assert model.fused_silu_mul and not model.fused_norm_rope  # fp32: F.rms_norm is one op
    got = triton_engine.generate(prompts, GREEDY)
    ref = engine(lm, "torch", "float32").generate(prompts, GREEDY)
    for a, b in zip(got, ref, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-4)
        assert (b.budget_pages == 4).any()  # sparse steps happened


def test_triton_engine_bf16_runs_every_fused_kernel(lively_qwen3):
    """bf16: every fused kernel on. Its first token comes from the prefill (fused norms, RoPE and
    SwiGLU around SDPA) and must be the torch engine's. Later tokens may part: the Triton path
    scores bf16 summaries (torch: fp32) and attends in fp32, and the interpreter truncates bf16
    casts where compiled kernels round; tests/rollout/test_model_fused_ops.py holds the fused
    forward to the torch forward."""
    lm = lively_qwen3
    prompts = random_prompts(lm.model.config.vocab_size, [23, 9], seed=4)
    triton_engine = engine(lm, "triton", "bfloat16")
    assert triton_engine.runner.model.fused_norm_rope and triton_engine.runner.model.fused_silu_mul
    got = triton_engine.generate(prompts, GREEDY)
    ref = engine(lm, "torch", "bfloat16").generate(prompts, GREEDY)
    for a, b in zip(got, ref, strict=True):
        assert a.token_ids[0] == b.token_ids[0]
        assert abs(float(a.logprobs[0] - b.logprobs[0])) < 0.05
        assert len(a.token_ids) == 12 and torch.isfinite(a.logprobs).all()


def test_cpu_engine_keeps_the_torch_path(tiny_qwen3):
    """auto on CPU: no Triton kernel in the model (the CPU path is unchanged)."""
    model = LLMEngine(tiny_qwen3.model, tiny_qwen3.tokenizer, EngineConfig(page_size=4,
                      num_pages=16, dtype="bfloat16")).runner.model  # fmt: skip
    assert not model.fused_silu_mul and not model.fused_norm_rope
