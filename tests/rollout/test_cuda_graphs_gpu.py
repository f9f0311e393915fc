"""CUDA-graph replay of the decode forward equals eager, for every batch bucket (needs CUDA).

Run by scripts/gpu_check.sh. A model with Qwen3-1.7B's attention shapes (16 q / 8 KV heads,
head dim 128; 4 layers, layers 0-1 dense), Triton kernels compiled. Each step is run eagerly on
the plan's padded inputs, then replayed from its graph: the logits must be bitwise equal (same
kernels on the same inputs). Then whole generate calls with and without graphs agree.
"""

import pytest
import torch

from sparrow.bench.random_runner import RandomWeights, advance, prefilled_runner, qwen3_1p7b_shaped

pytestmark = pytest.mark.gpu

BATCHES = [1, 2, 3, 5, 8, 11, 16, 24, 33]  # buckets 1, 2, 4, 8, 8, 12, 16, 24, 40


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replay_equals_eager_for_every_batch_bucket(dtype):
    config = qwen3_1p7b_shaped(hidden=256, vocab=512, layers=4)
    weights = RandomWeights(config, device="cuda")
    for batch in BATCHES:
        lens = [40 + 37 * i for i in range(batch)]  # 3..80 pages: rows sparse and dense
        runner, seqs, bm = prefilled_runner(
            config, dtype, "auto", lens, weights=weights, cuda_graphs=True
        )
        for step_index in range(3):
            budgets = [4 + (i % 3) for i in range(batch)] if step_index != 1 else None
            step = runner.plan.update(seqs, budgets)
            eager = runner._forward(step).clone()  # (B_pad, V)
            replayed = runner.graphs(step)
            assert torch.equal(replayed, eager), (batch, step_index)
            logits = runner.decode(seqs, budgets, update_summaries=True)  # replays again
            assert torch.equal(logits, eager[:batch])
            advance(seqs, bm, logits)
        # A sparse and a dense shape (a third if a length crossed a bucket); no eager fallback.
        assert 2 <= runner.graphs.num_captured <= 3 and runner.graphs.num_eager == 0
        assert runner.graphs.num_replayed >= 6


def test_generate_with_graphs_matches_eager_generate(lively_llama):
    from tiny_lm import random_prompts

    from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams

    model = lively_llama.model.to("cuda")
    try:
        prompts = random_prompts(model.config.vocab_size, [37, 9, 60, 21, 5], seed=1)
        params = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True)
        outs = {}
        for graphs in (False, True):
            cfg = EngineConfig(page_size=16, num_pages=256, cuda_graphs=graphs, seed=5)
            engine = LLMEngine(model, lively_llama.tokenizer, cfg, schedule=lambda ctx: 3)
            outs[graphs] = engine.generate(prompts, params, n=3)
        assert engine.runner.graphs.num_replayed > 0
        for a, b in zip(outs[True], outs[False], strict=True):
            assert a.token_ids == b.token_ids
            torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-4)
    finally:
        model.to("cpu")
