"""LLMEngine on tiny models: ordering, prompt sharing, preemption, stops, records, sparse decode."""

import pytest
import torch
from tiny_lm import random_prompts

from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def make_engine(lm, **overrides):
    cfg = EngineConfig(**{"page_size": 4, "num_pages": 128, **overrides})
    return LLMEngine(lm.model, lm.tokenizer, cfg)


def acceptance(p_logits, q_logits):
    """Exact a_t = sum_v min(p, q) over the full vocabulary, per row."""
    return torch.minimum(p_logits.log_softmax(-1), q_logits.log_softmax(-1)).exp().sum(-1)


def test_outputs_are_prompt_major_and_samples_of_a_prompt_share_it(lively_llama):
    engine = make_engine(lively_llama)
    prompts = random_prompts(engine.runner.model.shape.vocab_size, [6, 11, 3])
    outs = engine.generate(prompts, GREEDY, n=3)
    assert [(o.prompt_index, o.sample_index) for o in outs] == [
        (i, j) for i in range(3) for j in range(3)
    ]
    assert all(o.prompt_ids == prompts[o.prompt_index] for o in outs)
    # Greedy samples of one prompt agree with each other and with an unshared (n=1) run, so the
    # shared prompt pages and the per-sample copies of the partial page hold the right K/V.
    single = engine.generate(prompts, GREEDY, n=1)
    for o in outs:
        assert o.token_ids == single[o.prompt_index].token_ids
    assert len({tuple(s.token_ids) for s in single}) == 3  # the model is context-sensitive


def test_samples_share_prompt_pages_instead_of_copying_them(lively_llama):
    # 40-token prompt = 10 full pages. 4 samples x 8 tokens need 10 + 4 x 2 = 18 pages shared,
    # 4 x 12 = 48 unshared: a 24-page pool runs them without preemption only if pages are shared.
    engine = make_engine(lively_llama, num_pages=24)
    prompts = random_prompts(engine.runner.model.shape.vocab_size, [40])
    engine.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True), n=4)
    stats = engine.last_stats
    assert stats.num_preemptions == 0
    assert stats.prefill_tokens == 40  # the shared prompt ran through the model once
    assert stats.decode_tokens == 4 * 7 and stats.decode_s > 0


def test_small_pool_preempts_and_gives_the_same_greedy_outputs(lively_llama):
    prompts = random_prompts(lively_llama.model.config.vocab_size, [9, 14, 5, 12, 7, 10])
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    big = make_engine(lively_llama, num_pages=256).generate(prompts, params, n=2)
    small_engine = make_engine(lively_llama, num_pages=12)  # one sequence needs up to 10
    small = small_engine.generate(prompts, params, n=2)
    assert small_engine.last_stats.num_preemptions > 0
    assert [o.token_ids for o in small] == [o.token_ids for o in big]
    assert all(len(o.token_ids) == 24 for o in small)
    for s, b in zip(small, big, strict=True):
        assert torch.allclose(s.logprobs, b.logprobs, atol=1e-4)
    assert sum(o.num_preemptions for o in small) == small_engine.last_stats.num_preemptions


def test_request_that_cannot_fit_alone_is_a_clear_error(lively_llama):
    engine = make_engine(lively_llama, num_pages=4)  # 16 tokens
    with pytest.raises(ValueError, match="only 4 pages"):
        engine.generate([[5] * 10], SamplingParams(max_tokens=8))


def test_stop_conditions(lively_llama):
    engine = make_engine(lively_llama)
    prompt = random_prompts(engine.runner.model.shape.vocab_size, [8], seed=3)
    ref = engine.generate(prompt, GREEDY)[0]
    assert ref.finish_reason == "length" and len(ref.token_ids) == 16
    target = ref.token_ids[5]
    first = ref.token_ids.index(target)
    out = engine.generate(prompt, SamplingParams(0.0, max_tokens=16, stop_token_ids=(target,)))[0]
    assert out.finish_reason == "stop" and out.token_ids == ref.token_ids[: first + 1]
    eos_ids, engine.eos_token_ids = engine.eos_token_ids, (target,)
    out = engine.generate(prompt, SamplingParams(0.0, max_tokens=16))[0]
    assert out.finish_reason == "eos" and out.token_ids == ref.token_ids[: first + 1]
    assert engine.generate(prompt, GREEDY)[0].token_ids == ref.token_ids  # ignore_eos
    engine.eos_token_ids = eos_ids
    # Stop string: the text of tokens 6..7 must end the completion at token 7 at the latest.
    stop = engine.tokenizer.decode(ref.token_ids[6:8]).strip()
    assert stop and stop not in engine.tokenizer.decode(ref.token_ids[:6])
    out = engine.generate(prompt, SamplingParams(0.0, max_tokens=16, stop_strings=(stop,)))[0]
    assert out.finish_reason == "stop" and len(out.token_ids) <= 8 and stop in out.text


def test_records_match_teacher_forcing_and_budgets(lively_llama):
    engine = make_engine(lively_llama)
    vocab = engine.runner.model.shape.vocab_size
    prompts = random_prompts(vocab, [7, 13])
    params = SamplingParams(temperature=0.7, top_k=50, max_tokens=20, ignore_eos=True)
    outs = engine.generate(prompts, params)
    forced = engine.score(prompts, [o.token_ids for o in outs])
    for o, logits in zip(outs, forced, strict=True):
        ids = torch.tensor(o.token_ids)
        logprobs = (logits / 0.7).log_softmax(-1)  # (T, V) full vocabulary
        assert torch.allclose(o.logprobs, logprobs[torch.arange(len(ids)), ids], atol=1e-4)
        assert torch.allclose(o.topk_logprobs, logprobs.topk(20).values, atol=1e-4)
        assert (o.sampling_logprobs >= o.logprobs - 1e-6).all()  # truncation renormalises up
        context = len(o.prompt_ids) + torch.arange(20, dtype=torch.int32)
        assert torch.equal(o.context_lens, context)
        assert torch.equal(o.budget_pages, (context + 3) // 4)  # dense: all pages
    engine.set_schedule(lambda context_tokens: 3)
    o = engine.generate(prompts[1:], params)[0]
    pages = (o.context_lens + 3) // 4
    assert o.budget_pages[0] == pages[0]  # produced by the dense prefill
    assert torch.equal(o.budget_pages[1:], pages[1:].clamp(max=3))


def test_seeded_generation_is_reproducible(lively_llama):
    prompts = random_prompts(lively_llama.model.config.vocab_size, [5, 9])
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    a = make_engine(lively_llama, seed=3).generate(prompts, params, n=2)
    b = make_engine(lively_llama, seed=3).generate(prompts, params, n=2)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert len({tuple(o.token_ids) for o in a[:2]}) == 2  # samples of a prompt differ


def test_sparse_decode_lowers_acceptance_and_full_budget_equals_dense(lively_llama):
    engine = make_engine(lively_llama)
    vocab = engine.runner.model.shape.vocab_size
    prompts = random_prompts(vocab, [40, 6], seed=4)
    completions = random_prompts(vocab, [24, 24], seed=5)
    dense = engine.score(prompts, completions)
    engine.set_schedule(lambda context_tokens: 4)  # 16 of 41..64 tokens for the long prompt
    sparse = engine.score(prompts, completions)
    acc_long = acceptance(dense[0], sparse[0])
    assert acc_long.min() < 0.99 and torch.equal(dense[0][0], sparse[0][0])  # prefill dense
    # The short sequence (<= 30 tokens = 8 pages) ran sparse only once past 16 tokens.
    acc_short = acceptance(dense[1], sparse[1])
    assert torch.allclose(acc_short[:10], torch.ones(10), atol=1e-5) and acc_short.min() < 0.999
    # Budget >= pages in a batch where another sequence is sparse: the selection path keeps
    # every page and the result equals dense.
    engine.set_schedule(lambda context_tokens: 4 if context_tokens > 40 else 100)
    mixed = engine.score(prompts, completions)
    assert torch.allclose(mixed[1], dense[1], atol=1e-5)
    engine.set_schedule(lambda context_tokens: 100)
    full = engine.score(prompts, completions)
    assert all(torch.equal(a, b) for a, b in zip(full, dense, strict=True))


def test_dense_layers_are_configurable(lively_llama):
    vocab = lively_llama.model.config.vocab_size
    prompts, completions = random_prompts(vocab, [40], seed=6), random_prompts(vocab, [12], seed=7)
    results = []
    for dense_layers in [(0, 1), (0, 1, 2, 3)]:
        engine = make_engine(lively_llama, dense_layers=dense_layers)
        engine.set_schedule(lambda context_tokens: 4)
        results.append(engine.score(prompts, completions)[0])
    dense = make_engine(lively_llama).score(prompts, completions)[0]
    assert torch.allclose(results[1], dense, atol=1e-5)  # every layer dense
    assert not torch.allclose(results[0], dense, atol=1e-3)


def test_score_shares_identical_prompts(lively_llama):
    engine = make_engine(lively_llama, num_pages=16)
    vocab = engine.runner.model.shape.vocab_size
    prompt = random_prompts(vocab, [30], seed=8)[0]  # 8 pages, 7 of them full
    completions = random_prompts(vocab, [6, 9, 3], seed=9)
    # Unshared this needs 9 + 10 + 9 = 28 pages; shared 7 + 2 + 3 + 2 = 14.
    shared = engine.score([prompt] * 3, completions)
    alone = [make_engine(lively_llama).score([prompt], [c])[0] for c in completions]
    for a, b in zip(shared, alone, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_per_sequence_schedules_match_engine_wide_ones(lively_llama):
    # One call with a dense and a sparse replay of the same prompt (one shared prefill) gives
    # what two calls with an engine-wide schedule give.
    engine = make_engine(lively_llama)
    vocab = engine.runner.model.shape.vocab_size
    prompt = random_prompts(vocab, [40], seed=10)[0]
    completion = random_prompts(vocab, [16], seed=11)[0]
    tight = lambda context_tokens: 4  # noqa: E731
    both = engine.score([prompt] * 2, [completion] * 2, schedules=[None, tight])
    dense = engine.score([prompt], [completion])[0]
    engine.set_schedule(tight)
    sparse = engine.score([prompt], [completion])[0]
    assert torch.allclose(both[0], dense, atol=1e-5) and torch.allclose(both[1], sparse, atol=1e-5)
    assert acceptance(both[0], both[1]).min() < 0.99  # the two rows really differ
    # generate: the override wins over the engine's schedule, per sample.
    outs = engine.generate([prompt], GREEDY, n=2, schedules=[None, tight])
    alone_sparse = engine.generate([prompt], GREEDY)[0]
    engine.set_schedule(None)
    alone_dense = engine.generate([prompt], GREEDY)[0]
    assert outs[0].token_ids == alone_dense.token_ids
    assert outs[1].token_ids == alone_sparse.token_ids
    assert outs[0].budget_pages.tolist() != outs[1].budget_pages.tolist()
    with pytest.raises(ValueError, match="2 schedules for 1 sequences"):
        engine.score([prompt], [completion], schedules=[None, tight])


def test_fused_cpu_kernel_decodes_like_the_torch_ops(lively_llama):
    # backend "auto" on CPU fp32 runs the sparse layers through the fused C++ kernel (when a
    # compiler is installed); "torch" through select_pages + paged_decode.
    vocab = lively_llama.model.config.vocab_size
    prompts = random_prompts(vocab, [40, 23, 57], seed=10)
    completions = random_prompts(vocab, [20, 20, 20], seed=11)
    results = {}
    for backend in ("cpp", "torch"):
        engine = make_engine(lively_llama, backend=backend)
        assert engine.runner.kv._fused_sparse == (backend == "cpp")
        engine.set_schedule(lambda context_tokens: 4)  # 16 tokens: sparse past 4 pages
        scores = engine.score(prompts, completions)
        tokens = [o.token_ids for o in engine.generate(prompts, GREEDY)]
        results[backend] = scores, tokens
    for a, b in zip(results["cpp"][0], results["torch"][0], strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=0)
    assert results["cpp"][1] == results["torch"][1]
