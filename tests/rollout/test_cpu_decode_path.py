"""The CPU decode path (issue 32): the machinery that exists for CUDA graphs (shapes padded to
buckets, the logits copied out of a graph's buffer) stays off on a CPU, so its sparse decode costs
what it did before that machinery; the padded fixed-shape path gives the same tokens and logits."""

import pytest
import torch
from tiny_lm import random_prompts

from sparrow.kernels.decode_cpu import cpu_kernel
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PAGE = 4
BUDGET = 4  # pages: sparse past 16 tokens


def make_engine(lm, **overrides):
    cfg = EngineConfig(**{"page_size": PAGE, "num_pages": 128, "num_sink": 1, **overrides})
    engine = LLMEngine(lm.model, lm.tokenizer, cfg)
    engine.set_schedule(lambda context_tokens: BUDGET)
    return engine


def spy_steps(engine):
    """Record every decode step's metadata (after the plan) and whether the logits the sampler
    gets are the runner's own tensor (no copy)."""
    kv, runner = engine.runner.kv, engine.runner
    metas, returned, sampled = [], [], []
    prepare, decode, sampler = kv.prepare_decode, runner.decode, engine.sampler

    def prepare_spy(meta):
        prepare(meta)
        metas.append(meta)

    def decode_spy(*args, **kwargs):
        out = decode(*args, **kwargs)
        returned.append(out.data_ptr())
        return out

    class SamplerSpy:
        reseed = sampler.reseed

        def __call__(self, logits, *args, **kwargs):
            sampled.append(logits.data_ptr())
            return sampler(logits, *args, **kwargs)

    kv.prepare_decode, runner.decode, engine.sampler = prepare_spy, decode_spy, SamplerSpy()
    return metas, returned, sampled


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_cpu_sparse_decode_takes_the_eager_unpadded_path(lively_llama, backend):
    if backend == "auto" and cpu_kernel() is None:
        pytest.skip("the C++ decode kernel does not build here")
    engine = make_engine(lively_llama, backend=backend)
    runner = engine.runner
    assert runner.graphs is None and not runner.plan.pad_shapes
    assert not runner.kv.writes_decode_summaries  # the runner refreshes summaries once per step
    metas, returned, sampled = spy_steps(engine)
    prompts = random_prompts(runner.model.shape.vocab_size, [30, 9])
    engine.generate(prompts, GREEDY, n=2)

    sparse = [m for m in metas if m.budgets is not None]
    assert len(sparse) == len(metas) == GREEDY.max_tokens - 1  # every step has a sparse row
    for meta in sparse:
        lens = meta.seq_lens.tolist()
        pages = [-(-n // PAGE) for n in lens]
        # Exact shapes: the batch's rows and its longest row's pages, no bucket padding.
        assert meta.page_table.shape == (len(lens), max(pages))
        assert meta.max_selected == max(min(BUDGET, p) for p in pages)
        if backend == "auto":  # the C++ kernel selects and attends in one pass: no torch plan
            assert meta.selection is None
        else:
            assert meta.selection.max_selected == meta.max_selected
            assert meta.selection.phys.shape == meta.page_table.shape
    # The sampler reads the forward's own logits: no per-step copy (a graph's buffer needs one).
    assert sampled[-len(returned) :] == returned


def test_cpu_score_does_not_copy_each_step_s_logits(lively_llama, monkeypatch):
    """Teacher forcing on a CPU keeps each decode step's logits as the runner returns them
    (with CUDA graphs they are the graph's buffer, which the next step overwrites: copied)."""
    engine = make_engine(lively_llama, backend="torch")
    vocab = engine.runner.model.shape.vocab_size
    prompts = random_prompts(vocab, [30, 9])
    completions = random_prompts(vocab, [8, 8], seed=1)
    clones, clone = [], torch.Tensor.clone

    def counting_clone(self, *args, **kwargs):
        if self.dim() == 2 and self.shape[-1] == vocab:
            clones.append(tuple(self.shape))
        return clone(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "clone", counting_clone)
    scored = engine.score(prompts, completions)
    assert [s.shape for s in scored] == [(8, vocab)] * 2 and clones == []


def test_padded_fixed_shape_path_gives_the_cpu_path_s_tokens_and_logits(lively_llama):
    """The GPU's bucketed shapes (padding rows, page columns and selection counts) through the
    torch backend against the CPU's exact shapes: same pages kept, hence the same greedy tokens
    and (up to GEMM blocking at a larger batch) the same logits."""
    eager = make_engine(lively_llama, backend="torch")
    padded = make_engine(lively_llama, backend="torch")
    padded.runner.plan.pad_shapes = True
    metas_padded = spy_steps(padded)[0]
    prompts = random_prompts(eager.runner.model.shape.vocab_size, [30, 9, 21])
    want = eager.generate(prompts, GREEDY, n=1)
    got = padded.generate(prompts, GREEDY, n=1)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    # The padded run really padded: 3 rows -> 4, selection counts rounded up to buckets.
    assert all(m.page_table.shape[0] == 4 for m in metas_padded)
    completions = [o.token_ids for o in want]
    scored_eager = eager.score(prompts, completions)
    scored_padded = padded.score(prompts, completions)
    for a, b in zip(scored_eager, scored_padded, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
