"""Speculative rollouts (rollout/speculative.py, speculative_round.py): the sparse policy drafts,
the dense policy verifies, and every sampled token is distributed as dense sampling draws it.

Exactness three ways: (a) greedy speculative generation equals greedy dense generation token for
token, at budgets from the floor to all pages; (b) the accept/resample rule, given explicit draft
and target distributions (under temperature, top-p and top-k), emits tokens distributed as the
target (chi-square, n = 40,000 per case, alpha = 1e-3); (c) under sampling, the marginals of
speculative rollouts from a tiny model match dense rollouts' (chi-square homogeneity, n = 3,000
per arm, alpha = 1e-3), while today's approximate sparse mode at the floor budget fails the same
test (so it has power).
"""

import pytest
import torch
from tiny_lm import random_prompts

from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams
from sparrow.rollout.sampler import Distributions
from sparrow.rollout.sequence import Sequence
from sparrow.rollout.speculative import SpeculativeConfig, accept_drafts
from sparrow.rollout.speculative_round import speculative_round

ALPHA = 1e-3
FLOOR = 3  # num_sink 1 + num_recent 2: the smallest budget the engine runs


def make_engine(lm, budget, k=None, **overrides):
    cfg = EngineConfig(**{"page_size": 4, "num_pages": 256, **overrides})
    schedule = None if budget is None else (lambda context: budget)
    spec = None if k is None else SpeculativeConfig(enabled=True, draft_tokens=k)
    return LLMEngine(lm.model, lm.tokenizer, cfg, schedule=schedule, speculative=spec)


def chi_square_p(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """p-value of Pearson's goodness-of-fit statistic (cells with expected count >= 5)."""
    keep = expected >= 5
    stat = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), stat / 2))


def homogeneity_p(a: torch.Tensor, b: torch.Tensor) -> float:
    """p-value that two samples' category counts a, b come from one distribution."""
    n_a, n_b = a.sum(), b.sum()
    pooled = (a + b) / (n_a + n_b)
    keep = pooled * min(n_a, n_b) >= 5
    stat = sum(
        ((x[keep] - n * pooled[keep]) ** 2 / (n * pooled[keep])).sum()
        for x, n in ((a, n_a), (b, n_b))
    )
    df = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), stat / 2))


# (budget in pages, k): the floor to all pages (None: the draft is the dense policy itself).
BUDGETS_AND_K = [(FLOOR, 1), (FLOOR, 4), (4, 6), (7, 3), (None, 4)]


def test_greedy_speculative_equals_greedy_dense(lively_llama):
    prompts = random_prompts(lively_llama.model.config.vocab_size, [9, 40, 61])
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    dense = make_engine(lively_llama, None).generate(prompts, params, n=2)
    for budget, k in BUDGETS_AND_K:
        engine = make_engine(lively_llama, budget, k)
        spec = engine.generate(prompts, params, n=2)
        assert [o.token_ids for o in spec] == [o.token_ids for o in dense], (budget, k)
        for s, d in zip(spec, dense, strict=True):  # the recorded log-probs: the dense pass's
            torch.testing.assert_close(s.logprobs, d.logprobs, atol=2e-5, rtol=0)
            torch.testing.assert_close(s.topk_logprobs, d.topk_logprobs, atol=2e-5, rtol=0)
            assert s.topk_ids.tolist() == d.topk_ids.tolist()
            assert s.budget_pages.tolist() == d.budget_pages.tolist()  # dense: all pages
        stats = engine.last_stats
        assert stats.spec_rounds > 0 and stats.spec_drafted > 0
        if budget is None:  # the draft is the dense policy: every draft stands
            assert stats.spec_accepted == stats.spec_drafted
        # Each round emits its accepted drafts plus one token per sequence.
        assert stats.decode_tokens == sum(len(o.token_ids) - 1 for o in spec)


def test_the_torch_backends_verify_pass_is_dense_too(lively_llama):
    """The verify pass on the torch backend (one gather per sequence, its rows as SDPA query
    rows; the test above runs the C++ multi-query kernel): greedy still equals dense."""
    prompts = random_prompts(lively_llama.model.config.vocab_size, [9, 61])
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    dense = make_engine(lively_llama, None, backend="torch").generate(prompts, params, n=2)
    engine = make_engine(lively_llama, FLOOR, 4, backend="torch")
    spec = engine.generate(prompts, params, n=2)
    assert [o.token_ids for o in spec] == [o.token_ids for o in dense]
    for s, d in zip(spec, dense, strict=True):
        torch.testing.assert_close(s.logprobs, d.logprobs, atol=2e-5, rtol=0)
    assert engine.last_stats.spec_accepted < engine.last_stats.spec_drafted  # drafts rejected


def test_the_approximate_sparse_mode_differs_where_speculative_does_not(lively_llama):
    """The power of the test above: the floor budget alone changes the greedy tokens."""
    prompts = random_prompts(lively_llama.model.config.vocab_size, [40, 61])
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    dense = make_engine(lively_llama, None).generate(prompts, params)
    sparse = make_engine(lively_llama, FLOOR).generate(prompts, params)
    assert [o.token_ids for o in sparse] != [o.token_ids for o in dense]


def _rule_samples(q, p, n, seed):
    """n runs of accept_drafts with drafts drawn from q (k, V): the emitted tokens per run."""
    gen = torch.Generator().manual_seed(seed)
    k = q.shape[0]
    runs = []
    for _ in range(n):
        drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(k)]
        u = torch.rand(k, generator=gen)
        verdict = accept_drafts(
            q, p, drafts, u, lambda w: int(torch.multinomial(w, 1, generator=gen))
        )
        runs.append(drafts[: verdict.num_accepted] + [verdict.next_token])
    return runs


@pytest.mark.parametrize(
    "temperature, top_p, top_k", [(1.0, 1.0, None), (0.7, 0.9, None), (1.3, 1.0, 5)]
)
def test_accept_rule_emits_the_target_distribution(temperature, top_p, top_k):
    vocab, k, n = 8, 2, 40_000
    gen = torch.Generator().manual_seed(0)
    target_logits = torch.randn(k + 1, vocab, generator=gen) * 1.5
    draft_logits = target_logits + torch.randn(k + 1, vocab, generator=gen)  # a rough draft
    p = Distributions(target_logits, temperature, top_p, top_k).probs()  # (k + 1, V)
    q = Distributions(draft_logits[:k], temperature, top_p, top_k).probs()  # (k, V)
    runs = _rule_samples(q, p, n, seed=1)
    # The first emitted token is always there: its law must be p[0]; the second, given that the
    # first draft stood, is a fresh token at position 1: its law must be p[1].
    first = torch.bincount(torch.tensor([r[0] for r in runs]), minlength=vocab).double()
    assert chi_square_p(first, n * p[0].double()) > ALPHA
    second = [r[1] for r in runs if len(r) > 1]
    counts = torch.bincount(torch.tensor(second), minlength=vocab).double()
    assert chi_square_p(counts, len(second) * p[1].double()) > ALPHA
    accepted = sum(len(r) - 1 for r in runs) / n
    overlap = torch.minimum(p[:k], q).sum(-1)  # per-draft acceptance probability
    assert 0 < accepted < k and abs(accepted - (overlap[0] + overlap[0] * overlap[1])) < 0.03


def test_a_draft_equal_to_the_target_is_always_accepted_and_earns_the_bonus():
    vocab, k, n = 6, 3, 20_000
    p = torch.softmax(torch.randn(k + 1, vocab, generator=torch.Generator().manual_seed(2)), -1)
    runs = _rule_samples(p[:k], p, n, seed=3)
    assert all(len(r) == k + 1 for r in runs)
    bonus = torch.bincount(torch.tensor([r[k] for r in runs]), minlength=vocab).double()
    assert chi_square_p(bonus, n * p[k].double()) > ALPHA


def _marginals(outs, position, vocab):
    return torch.bincount(
        torch.tensor([o.token_ids[position] for o in outs]), minlength=vocab
    ).double()


@pytest.mark.slow  # 3 x 3,000 rollouts: minutes on a loaded 2-core CPU
def test_sampled_speculative_rollouts_match_dense_ones_and_sparse_ones_do_not(lively_llama):
    vocab = lively_llama.model.config.vocab_size
    prompt = random_prompts(vocab, [61], seed=4)
    # Temperature and top-k keep each position's law on a few tokens: cells a test can count.
    params = SamplingParams(temperature=0.8, top_k=6, max_tokens=6, ignore_eos=True)
    n = 3000
    dense = make_engine(lively_llama, None, max_batch_size=256).generate(
        prompt, params, n=n, seed=10
    )
    spec_engine = make_engine(lively_llama, FLOOR, k=4, max_batch_size=256)
    spec = spec_engine.generate(prompt, params, n=n, seed=11)
    sparse = make_engine(lively_llama, FLOOR, max_batch_size=256).generate(
        prompt, params, n=n, seed=12
    )
    assert spec_engine.last_stats.spec_accepted < spec_engine.last_stats.spec_drafted
    # Positions 1..3 are drafted and verified (position 0 comes from the dense prefill).
    positions = [1, 2, 3]
    spec_p = [
        homogeneity_p(_marginals(spec, t, vocab), _marginals(dense, t, vocab)) for t in positions
    ]
    sparse_p = [
        homogeneity_p(_marginals(sparse, t, vocab), _marginals(dense, t, vocab)) for t in positions
    ]
    alpha = ALPHA / len(positions)  # Bonferroni over the positions
    assert min(spec_p) > alpha, spec_p
    assert min(sparse_p) < alpha, sparse_p


def test_a_round_gives_back_the_pages_of_rejected_drafts(lively_llama):
    """After every round a sequence holds only the pages its tokens need: drafts that crossed
    into a new page and were rejected return it to the pool."""
    engine = make_engine(lively_llama, FLOOR, k=6)
    params = SamplingParams(temperature=1.0, max_tokens=60, ignore_eos=True)
    prompt = random_prompts(lively_llama.model.config.vocab_size, [30], seed=5)[0]
    scheduler = engine._new_scheduler()
    bm = scheduler.block_manager
    seq = Sequence(0, 0, prompt, params.max_tokens, schedule=engine.schedule)
    scheduler.add(seq)
    engine.sampler.reseed(0)
    logits = engine.runner.prefill(scheduler.schedule().groups, True)  # (1, V)
    seq.completion_ids.append(int(logits[0].argmax()))
    released = 0
    while len(seq.completion_ids) < 40:
        batch = scheduler.schedule()
        step = speculative_round(engine, batch.seqs, bm, params, tracked=True)
        drafted_pages = bm.pages_for_tokens(seq.num_tokens + step.drafted)
        seq.completion_ids += step.tokens
        # Its cached tokens' pages (all but the newest token), and at most the newest's page.
        cached, newest = (
            bm.pages_for_tokens(seq.num_tokens - 1),
            bm.pages_for_tokens(seq.num_tokens),
        )
        assert cached <= len(seq.page_table) <= newest
        assert bm.num_free_pages == bm.num_pages - len(seq.page_table)
        released += drafted_pages > len(seq.page_table)
    assert released > 0  # some round's drafts crossed a page and were cut back


def test_sampled_rows_record_the_dense_policys_log_probs(lively_llama):
    """What the trainer's rollout correction reads: each token's recorded log-prob is the dense
    policy's (a dense `score` of the same tokens), not the sparse draft's."""
    prompts = random_prompts(lively_llama.model.config.vocab_size, [33, 47])
    params = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, return_logits=True)
    engine = make_engine(lively_llama, FLOOR, k=4)
    outs = engine.generate(prompts, params, n=3)
    assert engine.last_stats.spec_accepted < engine.last_stats.spec_drafted  # rejections met
    dense = make_engine(lively_llama, None)
    scored = dense.score([o.prompt_ids for o in outs], [o.token_ids for o in outs])
    for out, logits in zip(outs, scored, strict=True):
        ids = torch.tensor(out.token_ids)[:, None]
        expected = logits.log_softmax(-1).gather(1, ids)[:, 0]
        torch.testing.assert_close(out.logprobs, expected, atol=2e-5, rtol=0)
        torch.testing.assert_close(out.logits, logits, atol=2e-4, rtol=0)
