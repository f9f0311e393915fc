"""LLMEngine.generate with SamplingParams(return_logits=True): each output carries the raw logits
(T, V) its tokens were sampled from, the same as `score`'s teacher-forced replay of the row under
the same schedule (max abs diff over every row, token and vocabulary entry <= 1e-4), through
per-sequence schedules, n > 1, preemption and every way a completion stops."""

import torch
from tiny_lm import random_prompts

from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams

TEMPERATURE = 0.8


def make_engine(lm, **overrides):
    cfg = EngineConfig(**{"page_size": 4, "num_pages": 128, **overrides})
    return LLMEngine(lm.model, lm.tokenizer, cfg)


def sparse(context_tokens: int) -> int:
    return 3  # pages of 4 tokens: decodes read 3 of them once the context passes 12 tokens


def params(**overrides) -> SamplingParams:
    fields = {"temperature": TEMPERATURE, "top_k": 50, "max_tokens": 16, "ignore_eos": True}
    return SamplingParams(**{**fields, "return_logits": True, **overrides})


def assert_sampled_from(out, vocab: int) -> None:
    """The kept rows are the distributions the recorded tokens came from, one row per token."""
    assert out.logits.shape == (len(out.token_ids), vocab) and out.logits.dtype == torch.float32
    logprobs = (out.logits / TEMPERATURE).log_softmax(-1)  # (T, V)
    ids = torch.tensor(out.token_ids)
    assert (logprobs[torch.arange(len(ids)), ids] - out.logprobs).abs().max() <= 1e-5
    assert (
        logprobs.topk(out.topk_logprobs.shape[1]).values - out.topk_logprobs
    ).abs().max() <= 1e-5


def max_diff_to_replay(engine, outs, schedules) -> list[float]:
    replay = engine.score([o.prompt_ids for o in outs], [o.token_ids for o in outs], schedules)
    return [float((o.logits - r).abs().max()) for o, r in zip(outs, replay, strict=True)]


def test_logits_equal_the_replay_with_mixed_schedules_and_n_samples(lively_llama):
    engine = make_engine(lively_llama)
    vocab = engine.runner.model.shape.vocab_size
    prompts = random_prompts(vocab, [19, 6, 13], seed=21)
    schedules = [sparse, sparse, None, None, sparse, None]  # n = 2 per prompt, mixed
    outs = engine.generate(prompts, params(), n=2, schedules=schedules)
    for o in outs:
        assert_sampled_from(o, vocab)
    assert max(max_diff_to_replay(engine, outs, schedules)) <= 1e-4
    dense_replay = engine.score([outs[0].prompt_ids], [outs[0].token_ids], [None])[0]
    assert (outs[0].logits - dense_replay).abs().max() > 1e-3  # the sparse rows are sparse


def test_logits_are_off_by_default_and_do_not_change_sampling(lively_llama):
    vocab = lively_llama.model.config.vocab_size
    prompts = random_prompts(vocab, [9, 5], seed=22)
    plain = make_engine(lively_llama).generate(prompts, params(return_logits=False), n=2)
    kept = make_engine(lively_llama).generate(prompts, params(), n=2, logits_rows=[1, 0, 0, 1])
    assert all(o.logits is None for o in plain)
    assert [o.token_ids for o in kept] == [o.token_ids for o in plain]
    assert [o.logits is not None for o in kept] == [True, False, False, True]
    for o in (kept[0], kept[3]):
        assert_sampled_from(o, vocab)


def test_small_pool_preemption_keeps_one_row_per_token(lively_llama):
    vocab = lively_llama.model.config.vocab_size
    prompts = random_prompts(vocab, [9, 14, 5, 12, 7, 10], seed=23)
    sampling = params(max_tokens=24)
    replayer = make_engine(lively_llama, num_pages=256)  # score holds every row at once
    # Dense: a recompute prefill gives the distribution the replay gives, so every row matches.
    engine = make_engine(lively_llama, num_pages=12)  # one sequence needs up to 10 pages
    outs = engine.generate(prompts, sampling, n=2, schedules=[None] * 12)
    assert engine.last_stats.num_preemptions > 0
    assert max(max_diff_to_replay(replayer, outs, [None] * 12)) <= 1e-4
    for o in outs:
        assert_sampled_from(o, vocab)
    # Sparse: tokens sampled after a preemption attend to densely recomputed K/V, which the
    # sparse replay does not reproduce; the kept logits stay those the tokens were drawn from.
    engine = make_engine(lively_llama, num_pages=12)
    outs = engine.generate(prompts, sampling, n=2, schedules=[sparse] * 12)
    preempted = [o.num_preemptions > 0 for o in outs]
    assert any(preempted) and not all(preempted)
    diffs = max_diff_to_replay(replayer, outs, [sparse] * 12)
    assert max(d for d, p in zip(diffs, preempted, strict=True) if not p) <= 1e-4
    replay = replayer.score(
        [o.prompt_ids for o in outs], [o.token_ids for o in outs], [sparse] * 12
    )
    for o, r in zip(outs, replay, strict=True):
        assert_sampled_from(o, vocab)
        assert (o.logits[0] - r[0]).abs().max() <= 1e-4  # the first token: the shared prefill


def test_rows_end_with_the_completion_on_every_stop(lively_llama):
    engine = make_engine(lively_llama)
    vocab = engine.runner.model.shape.vocab_size
    prompts = random_prompts(vocab, [8, 15, 11], seed=24)
    sampling = params(
        max_tokens=12,
        ignore_eos=False,
        stop_token_ids=tuple(range(3, 12)),
        stop_strings=("z",),
    )
    engine.eos_token_ids = tuple(range(30, 60))  # sampling stops on every path within a few steps
    outs = engine.generate(prompts, sampling, n=4, schedules=[sparse, None] * 6)
    assert {o.finish_reason for o in outs} >= {"stop", "eos", "length"}
    assert len({len(o.token_ids) for o in outs}) > 3  # completions of many lengths
    for o in outs:
        assert_sampled_from(o, vocab)
    assert max(max_diff_to_replay(engine, outs, [sparse, None] * 6)) <= 1e-4
