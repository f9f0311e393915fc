"""A generate call's shared prompt prefix computed once (`EngineConfig.share_prefix`): the same
tokens and log-probs as full prefills, dense or sparse, with preemption, and no page left held;
a prompt that leaves the others' prefix inside a page shares only the whole pages before it."""

import pytest
import torch
from tiny_lm import random_prompts

from sparrow.rollout.block_manager import BlockManager
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams, shared_prefix_tokens
from sparrow.rollout.sequence import Sequence

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def make_engine(lm, share, **overrides):
    cfg = EngineConfig(**{"page_size": 4, "num_pages": 128, "share_prefix": share, **overrides})
    return LLMEngine(lm.model, lm.tokenizer, cfg)


def few_shot_like(vocab, prefix_len=22, tails=(3, 6, 1, 9, 4), seed=1):
    """Prompts that all start with one `prefix_len`-token prefix, then a tail of their own."""
    prefix = random_prompts(vocab, [prefix_len], seed=seed)[0]
    return [prefix + t for t in random_prompts(vocab, tails, seed=seed + 1)]


def on_and_off(lm, prompts, params, n=1, **overrides):
    """Outputs and last_stats of share_prefix on, then off."""
    results = []
    for share in (True, False):
        engine = make_engine(lm, share, **overrides)
        results.append((engine.generate(prompts, params, n=n), engine.last_stats))
    return results


def assert_same(on, off, atol=1e-4):
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    for a, b in zip(on, off, strict=True):
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=atol, rtol=0)
        torch.testing.assert_close(a.topk_logprobs, b.topk_logprobs, atol=atol, rtol=0)


def test_shared_prefix_is_whole_pages_and_leaves_every_prompt_a_token():
    assert shared_prefix_tokens([[1] * 10 + [2], [1] * 10 + [3]], 4) == 8
    assert shared_prefix_tokens([[1] * 8, [1] * 8 + [2]], 4) == 4  # the shorter keeps a token
    assert shared_prefix_tokens([[1] * 9, [1] * 9], 4) == 0  # one distinct prompt: samples share
    assert shared_prefix_tokens([[1, 1, 1, 5, 1, 1], [1, 1, 1, 6, 1, 1]], 2) == 2
    assert shared_prefix_tokens([[1, 2, 3, 4, 5], [2, 2, 3, 4, 5]], 2) == 0


def test_block_manager_holds_prefix_pages_for_the_call_and_every_user():
    bm = BlockManager(num_pages=10, page_size=4)
    pages = bm.hold_prefix(list(range(8)))
    group = [Sequence(i, 0, list(range(8)) + [50, 51], max_tokens=4) for i in range(2)]
    other = Sequence(2, 1, [9] * 10, max_tokens=4)  # does not start with the prefix
    assert bm.cached_tokens(group[0]) == 8 and bm.cached_tokens(other) == 0
    assert bm.max_group_size(10, 2, cached_tokens=8) == 2
    assert bm.prefill_cost(10, 2, cached_tokens=8) == 2  # one partial page each, nothing shared
    bm.allocate_prefill(group)
    assert all(s.page_table[:2] == pages and s.num_cached_tokens == 8 for s in group)
    assert [bm.ref_count(p) for p in pages] == [3, 3] and bm.num_free_pages == 6
    for seq in group:
        bm.free(seq)  # a preemption: the call still holds the prefix
    assert [bm.ref_count(p) for p in pages] == [1, 1] and bm.num_free_pages == 8
    bm.allocate_prefill(group[:1])  # the re-prefill takes the same pages again
    assert group[0].page_table[:2] == pages
    bm.free(group[0])
    bm.release_prefix()
    assert bm.num_free_pages == 10


def test_greedy_tokens_and_logprobs_match_full_prefills(lively_llama):
    prompts = few_shot_like(lively_llama.model.config.vocab_size)
    (on, on_stats), (off, off_stats) = on_and_off(lively_llama, prompts, GREEDY, n=2)
    assert_same(on, off)
    assert len({tuple(o.token_ids) for o in on}) >= 4  # context-sensitive: tails matter
    # The 20-token (5-page) prefix ran through the model once instead of once per prompt.
    assert off_stats.prefill_tokens - on_stats.prefill_tokens == 4 * 20


def test_seeded_sampling_matches_full_prefills(lively_llama):
    prompts = few_shot_like(lively_llama.model.config.vocab_size)
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    (on, _), (off, _) = on_and_off(lively_llama, prompts, params, n=2, seed=3)
    assert_same(on, off)
    assert on[0].token_ids != on[1].token_ids  # samples of a prompt differ: it did sample


def test_sparse_schedule_matches_full_prefills(lively_llama):
    # Budget 4 pages (16 tokens) of 24..50-token contexts: the prefix pages are scored by their
    # summaries, which the prefix's own prefill must have written.
    prompts = few_shot_like(lively_llama.model.config.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    sparse = []
    for share in (True, False):
        engine = make_engine(lively_llama, share)
        engine.set_schedule(lambda context_tokens: 4)
        sparse.append(engine.generate(prompts, params))
    assert_same(*sparse)
    dense = make_engine(lively_llama, True).generate(prompts, params)
    assert [o.token_ids for o in dense] != [o.token_ids for o in sparse[0]]  # it is sparse


def test_preemption_reuses_the_prefix_and_matches(lively_llama):
    prompts = few_shot_like(lively_llama.model.config.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    (on, on_stats), (off, _) = on_and_off(lively_llama, prompts, params, n=2, num_pages=20)
    (big, _), _ = on_and_off(lively_llama, prompts, params, n=2, num_pages=256)
    assert on_stats.num_preemptions > 0
    assert_same(on, off)
    assert_same(on, big)


def test_every_page_is_free_after_the_call_also_when_it_fails(lively_llama, monkeypatch):
    prompts = few_shot_like(lively_llama.model.config.vocab_size)
    engine = make_engine(lively_llama, True, num_pages=40)
    made = []
    new_scheduler = engine._new_scheduler
    monkeypatch.setattr(engine, "_new_scheduler", lambda: made.append(new_scheduler()) or made[-1])
    engine.generate(prompts, GREEDY, n=2)
    bm = made[-1].block_manager
    assert bm.num_free_pages == bm.num_pages

    calls = []
    decode = engine.runner.decode

    def failing_decode(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("device lost")
        return decode(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "decode", failing_decode)
    with pytest.raises(RuntimeError, match="device lost"):
        engine.generate(prompts, GREEDY, n=2)
    bm = made[-1].block_manager
    assert bm.num_free_pages == bm.num_pages and not any(map(bm.ref_count, range(bm.num_pages)))


@pytest.mark.slow
def test_smollm2_few_shot_prompts_match_full_prefills():
    """The real model on the few-shot task's prompts (a ~224-token shared prefix): greedy, seeded
    sampling, a sparse budget and a preempting pool all give the same tokens as full prefills."""
    from sparrow.models.loading import ModelConfig, load_model
    from sparrow.tasks.generators import TaskConfig, generate_tasks

    lm = load_model(ModelConfig("smollm2-135m-instruct"))
    tasks = generate_tasks(TaskConfig(few_shot=3, num_heldout=6), "heldout")
    template = lm.tokenizer.apply_chat_template
    prompts = [
        list(template(t["prompt"], add_generation_prompt=True, return_dict=True)["input_ids"])
        for t in tasks
    ]
    assert shared_prefix_tokens(prompts, 16) >= 12 * 16
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    sampled = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)

    def run(share, params, schedule=None, num_pages=256):
        cfg = EngineConfig(num_pages=num_pages, share_prefix=share, seed=5)
        engine = LLMEngine(lm.model, lm.tokenizer, cfg, schedule=schedule)
        return engine.generate(prompts, params), engine.last_stats

    reference = run(False, greedy)[0]
    assert_same(run(True, greedy)[0], reference)
    assert_same(run(True, sampled)[0], run(False, sampled)[0])
    sparse = [run(share, greedy, schedule=lambda context_tokens: 6)[0] for share in (True, False)]
    assert_same(*sparse)
    # 6 sequences need 14 prefix pages + 3 of their own each: 28 pages preempt.
    preempted, stats = run(True, greedy, num_pages=28)
    assert stats.num_preemptions > 0
    assert_same(preempted, reference)


def _diverging(prompt: list[int], at: int, vocab: int) -> list[int]:
    """`prompt` with token `at` replaced by another ordinary token (ids 3.. in the tiny vocab)."""
    changed = list(prompt)
    changed[at] = 3 + (changed[at] - 3 + 1) % (vocab - 3)
    return changed


def _recorded_prefills(engine, monkeypatch):
    """Per prompt prefilled by `engine.generate`: its page table, cached-token count and the
    (L, T, H_kv, D) K and V its pages hold right after its prefill; and the prefix pages held."""
    kv, ps = engine.runner.kv, engine.cfg.page_size
    prefills, held = {}, []
    prefill = engine.runner.prefill

    def recording_prefill(groups, update_summaries):
        logits = prefill(groups, update_summaries)
        for group in groups:
            seq = group[0]
            pos = torch.arange(seq.num_tokens)
            pages = torch.tensor(seq.page_table)[pos // ps]
            prefills[tuple(seq.token_ids)] = (
                list(seq.page_table),
                seq.num_cached_tokens,
                kv.k[:, pages, pos % ps].clone(),  # (L, T, H_kv, D)
                kv.v[:, pages, pos % ps].clone(),
            )
        return logits

    hold_prefix = BlockManager.hold_prefix

    def recording_hold(self, token_ids):
        pages = hold_prefix(self, token_ids)
        held.extend(pages)
        return pages

    monkeypatch.setattr(engine.runner, "prefill", recording_prefill)
    monkeypatch.setattr(BlockManager, "hold_prefix", recording_hold)
    return prefills, held


@pytest.mark.parametrize("at", [2, 5], ids=["inside-first-page", "inside-second-page"])
def test_prompt_diverging_inside_the_shared_pages_matches_full_prefills(
    lively_llama, monkeypatch, at
):
    """Two prompts share a 20-token (5-page) prefix; a third follows them only up to token `at`,
    inside the first or the second of those pages. What all three share is held (0 or 1 page);
    each prompt's own pages start where it diverges, and hold the K/V a full prefill writes;
    tokens and log-probs are a full prefill's."""
    vocab = lively_llama.model.config.vocab_size
    first, second = few_shot_like(vocab)[:2]
    prompts = [first, second, _diverging(first, at, vocab)]
    shared = at // 4 * 4
    assert shared_prefix_tokens(prompts, 4) == shared

    runs = {}
    for share in (True, False):
        engine = make_engine(lively_llama, share)
        with monkeypatch.context() as patch:
            prefills, held = _recorded_prefills(engine, patch)
            outputs = engine.generate(prompts, GREEDY, n=2)
        runs[share] = (outputs, engine.last_stats, prefills, held)

    (on, on_stats, on_prefills, held), (off, off_stats, off_prefills, _) = runs[True], runs[False]
    assert_same(on, off)
    assert off_stats.prefill_tokens - on_stats.prefill_tokens == 2 * shared  # computed once
    assert len(held) == shared // 4
    for prompt in prompts:
        pages, cached, k, v = on_prefills[tuple(prompt)]
        assert cached == shared
        assert pages[: len(held)] == held  # the held prefix, and nothing of it beyond
        assert not set(pages[len(held) :]) & set(held)
        _, off_cached, off_k, off_v = off_prefills[tuple(prompt)]
        assert off_cached == 0
        torch.testing.assert_close(k, off_k, atol=1e-5, rtol=0)
        torch.testing.assert_close(v, off_v, atol=1e-5, rtol=0)


def test_block_manager_shares_nothing_with_a_sequence_leaving_the_prefix_midway():
    """Held prefix of 2 pages; sequences that leave it inside its first or second page, or
    stop before its end, get pages of their own and leave the held pages' counts alone."""
    bm = BlockManager(num_pages=16, page_size=4)
    prefix = list(range(10, 18))
    held = bm.hold_prefix(prefix)
    leavers = [
        prefix[:2] + [99] + prefix[3:] + [50, 51],  # inside the first page
        prefix[:5] + [99] + prefix[6:] + [50, 51],  # inside the second page
        prefix[:6],  # a prefix of the prefix
        prefix,  # the prefix itself: no token of its own
    ]
    seqs = [Sequence(i, i, tokens, max_tokens=4) for i, tokens in enumerate(leavers)]
    for seq in seqs:
        assert bm.cached_tokens(seq) == 0
        bm.allocate_prefill([seq])
        assert seq.num_cached_tokens == 0 and not set(seq.page_table) & set(held)
    assert [bm.ref_count(p) for p in held] == [1, 1]
    for seq in seqs:
        bm.free(seq)
    bm.release_prefix()
    assert bm.num_free_pages == bm.num_pages
