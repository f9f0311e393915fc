"""PagedKVCache: the all-layer summary table, and the deferred (once per step) refresh."""

import pytest
import torch
from tiny_lm import random_prompts

from sparrow.kernels import update_page_summaries
from sparrow.rollout.engine import EngineConfig, LLMEngine
from sparrow.rollout.paged_attention import PagedKVCache, SparseAttentionConfig


def make_cache(num_pages, score="quest"):
    cfg = SparseAttentionConfig(page_size=4, dense_layers=(0,), score=score)
    return PagedKVCache(
        cfg,
        num_layers=3,
        num_pages=num_pages,
        num_kv_heads=2,
        head_dim=8,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )


def test_summaries_of_every_sparse_layer_are_refreshed_in_one_call():
    quest, centroid = make_cache(num_pages=6), make_cache(num_pages=6, score="centroid")
    for kv in (quest, centroid):
        kv.k.normal_()
        kv.update_summaries(torch.tensor([3, 5]), torch.tensor([4, 2]))
        assert kv.summaries[0] is None
    for layer in (1, 2):
        s = quest.summaries[layer]
        assert s.k_mean is None  # Quest never reads the centroids: not allocated, not written
        assert torch.equal(s.k_min[5], quest.k[layer, 5, :2].amin(0))
        assert torch.equal(s.k_max[5], quest.k[layer, 5, :2].amax(0))
        assert (s.k_min[[0, 1, 2, 4]] == 0).all()  # untouched pages
        s = centroid.summaries[layer]
        assert s.k_min is None and s.k_max is None
        assert torch.allclose(s.k_mean[3], centroid.k[layer, 3].mean(0))
        assert (s.k_mean[[0, 1, 2, 4]] == 0).all()


@pytest.mark.parametrize("score", ["quest", "centroid"])
def test_refresh_in_layer_chunks_gives_the_same_table(score):
    kv = make_cache(num_pages=2100, score=score)  # 2100 pages per call: one layer per chunk
    kv.k.normal_()
    pages = torch.arange(2100)
    fills = torch.randint(1, 5, (2100,))
    kv.update_summaries(pages, fills)
    for layer in (1, 2):
        s = kv.summaries[layer]
        ref = make_cache(num_pages=2100, score=score).summaries[layer]
        update_page_summaries(kv.k[layer], ref, pages, fills)
        for got, expected in zip(s.tables, ref.tables, strict=True):
            assert torch.equal(got, expected)


def test_deferred_refresh_selects_like_refreshing_before_every_layer(lively_llama):
    vocab = lively_llama.model.config.vocab_size
    prompts = random_prompts(vocab, [37, 50], seed=1)
    completions = random_prompts(vocab, [20, 20], seed=2)
    cfg = EngineConfig(page_size=4, num_pages=64)
    engines = [LLMEngine(lively_llama.model, lively_llama.tokenizer, cfg) for _ in range(2)]
    eager = engines[1].runner.kv
    deferred_attention = eager.decode_attention

    def refresh_then_attend(layer, q, k, v, meta):
        """Reference: write this token, then summarise every page in use, then select."""
        out_k = eager.k[layer].clone()
        eager.k[layer].view(-1, *eager.k.shape[3:])[meta.slot_mapping] = k
        if eager.summaries[layer] is not None:
            pages = (meta.seq_lens.long() + 3) // 4  # (B,)
            for b in range(q.shape[0]):
                ids = meta.page_table[b, : pages[b]].long()
                fills = torch.full_like(ids, 4)
                fills[-1] = meta.seq_lens[b] - 4 * (pages[b] - 1)
                update_page_summaries(eager.k[layer], eager.summaries[layer], ids, fills)
        eager.k[layer].copy_(out_k)
        return deferred_attention(layer, q, k, v, meta)

    eager.decode_attention = refresh_then_attend
    results = []
    for engine in engines:
        engine.set_schedule(lambda context_tokens: 4)
        results.append(engine.score(prompts, completions))
    for a, b in zip(*results, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
