"""The dense layers' contiguous K/V copy: the same K/V as the pages, when appended and rebuilt."""

import torch
from tiny_lm import random_prompts

from sparrow.kernels import gather_kv, gather_plan, write_kv
from sparrow.rollout.dense_kv import DenseKVCopy
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams

PAGE, HEADS, DIM = 4, 2, 8


def paged_reference(k_cache, v_cache, tables, lens):
    """Each row's K, V (H_kv, len, D) read from the pages one token at a time."""
    out = []
    for table, n in zip(tables, lens, strict=True):
        slots = [table[t // PAGE] * PAGE + t % PAGE for t in range(n)]
        k = k_cache.view(-1, HEADS, DIM)[slots].transpose(0, 1)
        v = v_cache.view(-1, HEADS, DIM)[slots].transpose(0, 1)
        out.append((k, v))
    return out


class PagedBatch:
    """A paged cache holding random K/V for a few sequences, grown one token at a time."""

    def __init__(self, num_pages=64):
        self.k_cache = torch.randn(num_pages, PAGE, HEADS, DIM)
        self.v_cache = torch.randn(num_pages, PAGE, HEADS, DIM)
        self.free = list(range(num_pages))[::-1]
        self.tables, self.lens = {}, {}

    def add(self, seq_id, length):
        self.tables[seq_id] = [self.free.pop() for _ in range(-(-length // PAGE))]
        self.lens[seq_id] = length

    def grow(self, seq_id):
        """One more token for seq_id, written into its pages; returns its k, v (H_kv, D)."""
        n = self.lens[seq_id]
        if n % PAGE == 0:
            self.tables[seq_id].append(self.free.pop())
        k, v = torch.randn(HEADS, DIM), torch.randn(HEADS, DIM)
        slot = torch.tensor([self.tables[seq_id][n // PAGE] * PAGE + n % PAGE])
        write_kv(self.k_cache, self.v_cache, k[None], v[None], slot)
        self.lens[seq_id] = n + 1
        return k, v

    def step(self, copy, ids, layer=0):
        """One decode step of rows `ids` (each grown by one token) through the copy."""
        new = [self.grow(i) for i in ids]
        lens = [self.lens[i] for i in ids]
        width = max(len(self.tables[i]) for i in ids)
        table = torch.tensor([self.tables[i] + [0] * (width - len(self.tables[i])) for i in ids])
        copy.begin_step(list(ids), lens)
        plan = lambda: gather_plan(table, torch.tensor(lens), None, PAGE, HEADS)  # noqa: E731
        k = torch.stack([kv[0] for kv in new])
        v = torch.stack([kv[1] for kv in new])
        keys, values = copy.keys_values(layer, k, v, self.k_cache, self.v_cache, plan)
        ref = paged_reference(self.k_cache, self.v_cache, [self.tables[i] for i in ids], lens)
        for row, (n, (rk, rv)) in enumerate(zip(lens, ref, strict=True)):
            assert torch.equal(keys[row, :, :n], rk) and torch.equal(values[row, :, :n], rv)
        visible = copy.bias[:, 0, 0] == 0  # (B, T)
        assert visible.sum(1).tolist() == lens
        assert torch.isfinite(keys).all() and torch.isfinite(values).all()


def make_copy(pool_tokens=1024, grow_tokens=4):
    return DenseKVCopy(
        pool_tokens=pool_tokens,
        num_kv_heads=HEADS,
        head_dim=DIM,
        dtype=torch.float32,
        device=torch.device("cpu"),
        grow_tokens=grow_tokens,
    )


def test_appends_and_rebuilds_hold_the_paged_kv():
    torch.manual_seed(0)
    batch, copy = PagedBatch(), make_copy()
    for i, n in enumerate([5, 9, 2]):
        batch.add(i, n)
    calls = {"n": 0}
    real = gather_kv

    def counting(*args):
        calls["n"] += 1
        return real(*args)

    import sparrow.rollout.dense_kv as dense_kv

    dense_kv.gather_kv = counting
    try:
        batch.step(copy, [0, 1, 2])  # first step: rebuild
        for _ in range(10):  # appends, growing past the capacity (grow_tokens = 4) twice
            batch.step(copy, [0, 1, 2])
        grown = calls["n"]
        assert 2 <= grown <= 4  # the first build and each regrowth; the rest were appends
        batch.step(copy, [0, 2])  # a sequence finished: rows move, rebuild
        batch.step(copy, [0, 2])
        assert calls["n"] == grown + 1
        batch.step(copy, [2, 0])  # same sequences in other rows: rebuild
        assert calls["n"] == grown + 2
        copy.invalidate()  # a prefill rewrote pages: rebuild even though ids and lengths fit
        batch.step(copy, [2, 0])
        assert calls["n"] == grown + 3
        batch.step(copy, [2, 0], layer=1)  # layer 1 was not updated last step: rebuild
        assert calls["n"] == grown + 4
    finally:
        dense_kv.gather_kv = real


def test_copy_larger_than_the_pool_is_not_used():
    copy = make_copy(pool_tokens=40)
    copy.begin_step([0, 1, 2], [10, 11, 9])
    assert copy.active
    copy.begin_step([0, 1, 2, 3], [10, 11, 9, 12])  # 4 x 12 = 48 > 40 pool tokens
    assert not copy.active


def make_engine(lm, **overrides):
    cfg = EngineConfig(**{"page_size": 4, "num_pages": 256, **overrides})
    return LLMEngine(lm.model, lm.tokenizer, cfg)


def assert_same_outputs(a, b):
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.logprobs, y.logprobs, atol=1e-5, rtol=0)


def test_engine_equals_the_gather_path_when_sequences_finish_apart(lively_llama, monkeypatch):
    vocab = lively_llama.model.config.vocab_size
    prompts = random_prompts(vocab, [9, 14, 5, 12], seed=1)
    without = make_engine(lively_llama, dense_kv_copy=False)
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    # A stop token from the middle of one greedy completion: that sequence ends early and the
    # others go on, so the decode batch shrinks mid-call.
    stop = without.generate(prompts, greedy)[0].token_ids[6]
    params = SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=(stop,))
    reference = without.generate(prompts, params, n=2)
    assert len({len(o.token_ids) for o in reference}) > 1

    with_copy = make_engine(lively_llama)
    builds = {"n": 0}
    real = gather_kv

    def counting(*args):
        builds["n"] += 1
        return real(*args)

    monkeypatch.setattr("sparrow.rollout.dense_kv.gather_kv", counting)
    assert_same_outputs(with_copy.generate(prompts, params, n=2), reference)
    # A rebuild per layer at the first step and at each step after a sequence finished; every
    # other step (19 in all: 20 tokens, the first from the prefill) appends.
    num_layers = with_copy.runner.model.shape.num_layers
    finish_steps = {len(o.token_ids) for o in reference} - {20}
    assert builds["n"] == num_layers * (1 + len(finish_steps)) < num_layers * 19


def test_engine_equals_the_gather_path_with_preemption(lively_llama):
    prompts = random_prompts(lively_llama.model.config.vocab_size, [9, 14, 5, 12, 7, 10])
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with_copy = make_engine(lively_llama, num_pages=12)
    a = with_copy.generate(prompts, params, n=2)
    assert with_copy.last_stats.num_preemptions > 0
    assert_same_outputs(
        a,
        make_engine(lively_llama, num_pages=12, dense_kv_copy=False).generate(prompts, params, n=2),
    )


def test_a_new_call_never_reads_the_last_calls_copy(lively_llama):
    """Call 1's last decode step has lengths 9 (6-token prompts, 4 new tokens); call 2's first
    has 10 with the same sequence ids: only the prefill's invalidation tells them apart."""
    vocab = lively_llama.model.config.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    with_copy, without = make_engine(lively_llama), make_engine(lively_llama, dense_kv_copy=False)
    for lengths, seed in (([6, 6], 3), ([9, 9], 4)):
        prompts = random_prompts(vocab, lengths, seed=seed)
        assert_same_outputs(with_copy.generate(prompts, params), without.generate(prompts, params))


def test_samples_of_one_prompt_decode_densely_through_the_kernel(lively_llama, monkeypatch):
    """Rows sharing most of their pages (4 samples of a 40-token prompt) read them through the
    fused kernel over every page instead of per-row copies: the same tokens and log-probs as the
    torch backend's copies. Distinct prompts keep the copies."""
    from sparrow.rollout import paged_attention

    calls = {"all_pages": 0}
    real = paged_attention.sparse_decode_cpu

    def counting(*args, **kwargs):
        calls["all_pages"] += args[6] is None  # budgets: None = every page
        return real(*args, **kwargs)

    monkeypatch.setattr(paged_attention, "sparse_decode_cpu", counting)
    vocab = lively_llama.model.config.vocab_size
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    shared = random_prompts(vocab, [40], seed=3)
    fused = make_engine(lively_llama, seed=5)
    assert fused.runner.kv._fused_sparse
    outs = fused.generate(shared, params, n=4)
    num_layers = fused.runner.model.shape.num_layers
    assert calls["all_pages"] == num_layers * 11  # 11 decode steps, the first token from prefill
    assert_same_outputs(
        outs, make_engine(lively_llama, seed=5, backend="torch").generate(shared, params, n=4)
    )
    calls["all_pages"] = 0
    fused.generate(random_prompts(vocab, [40, 33, 37, 29], seed=4), params)
    assert calls["all_pages"] == 0


def test_the_shared_page_kernel_can_be_turned_off(lively_llama, monkeypatch):
    """`shared_page_kernel=False` (sparrow-bench dense-shared's other arm): samples of one prompt
    read per-row copies instead of the fused kernel, with the same tokens and log-probs."""
    from sparrow.rollout import paged_attention

    calls = {"all_pages": 0}
    real = paged_attention.sparse_decode_cpu

    def counting(*args, **kwargs):
        calls["all_pages"] += args[6] is None  # budgets: None = every page
        return real(*args, **kwargs)

    monkeypatch.setattr(paged_attention, "sparse_decode_cpu", counting)
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    shared = random_prompts(lively_llama.model.config.vocab_size, [40], seed=3)
    copies = make_engine(lively_llama, seed=5, shared_page_kernel=False)
    outs = copies.generate(shared, params, n=4)
    assert calls["all_pages"] == 0
    assert_same_outputs(outs, make_engine(lively_llama, seed=5).generate(shared, params, n=4))
    assert calls["all_pages"] > 0  # the default engine took the kernel on the same prompt
