"""The page-gathering sparse attention against the masked reference: outputs, gradients, memory."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import sparrow.distill.sparse_attention as sparse_attention
from sparrow.distill import DistillConfig, DistillSparse
from sparrow.distill.attention_reference import (
    masked_sparse_attention,
    register_reference_attention,
)
from sparrow.distill.page_gather_attention import page_gather_attention
from sparrow.distill.sparse_attention import SparseForwardMetadata, query_budgets
from sparrow.rollout.paged_attention import SparseAttentionConfig

TOLERANCE = 1e-5  # fp32: the two forms differ only by summation order


def _inputs(group: int, seed: int = 0):
    """Two sequences of 45 tokens (a partial last page of 4), mixed budgets of 3-8 pages:
    early queries and those with budget >= pages are dense, the rest sparse."""
    g = torch.Generator().manual_seed(seed)
    batch, num_kv_heads, seq_len, head_dim = 2, 2, 45, 8
    q = torch.randn(batch, num_kv_heads * group, seq_len, head_dim, generator=g)
    k = torch.randn(batch, num_kv_heads, seq_len, head_dim, generator=g)
    v = torch.randn(batch, num_kv_heads, seq_len, head_dim, generator=g)
    budgets = torch.randint(3, 9, (batch, seq_len), generator=g)  # (B, T)
    return [x.requires_grad_() for x in (q, k, v)], budgets


@pytest.mark.parametrize("score", ["quest", "centroid"])
@pytest.mark.parametrize("group", [1, 2, 3])
def test_outputs_and_gradients_match_the_masked_path(score, group):
    (q, k, v), budgets = _inputs(group)
    attn = SparseAttentionConfig(page_size=4, score=score)
    ref = masked_sparse_attention(q, k, v, 0.3, SparseForwardMetadata(attn, budgets))
    grad_out = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    pages = (torch.arange(45) + 4) // 4  # (T,) ceil((t + 1) / PAGE)
    sparse = budgets < pages
    assert 0.3 < sparse.float().mean() < 0.9  # both paths, in the same chunks
    # The selection matters: dense causal attention is far from the sparse output.
    dense = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    assert (dense - ref).abs()[sparse[:, None].expand_as(ref[..., 0])].max() > 0.1
    for chunk in (1, 7, 16, 45):  # one query per chunk, chunks cutting pages, one chunk
        out = page_gather_attention(q, k, v, budgets, attn, 0.3, chunk)
        assert (out - ref).abs().max() < TOLERANCE, chunk
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
        for name, got, want in zip("qkv", grads, ref_grads, strict=True):
            assert (got - want).abs().max() < TOLERANCE, (chunk, name)


@pytest.mark.parametrize("offset", [1, 13, 44])
def test_queries_after_a_cached_prefix_match_in_both_paths(offset):
    """DistillSparse's shared prefix gives the layer only the last T - offset queries, keys for
    all T: both paths then return those queries' rows of the full forward (the masked one once
    crashed on them, so `sparrow-bench distill-attention` lost its reference arm)."""
    (q, k, v), budgets = _inputs(2)
    attn = SparseAttentionConfig(page_size=4)
    meta = SparseForwardMetadata(attn, budgets)
    full = masked_sparse_attention(q, k, v, 0.3, meta)  # (B, H_q, T, D)
    tail = q[:, :, offset:]  # (B, H_q, T - offset, D)
    masked = masked_sparse_attention(tail, k, v, 0.3, meta)
    gathered = page_gather_attention(tail, k, v, budgets, attn, 0.3, 7)
    assert masked.shape == gathered.shape == tail.shape
    assert (masked - full[:, :, offset:]).abs().max() < TOLERANCE
    assert (gathered - masked).abs().max() < TOLERANCE
    grad_out = torch.randn_like(masked)
    want = torch.autograd.grad(masked, (q, k, v), grad_out)
    got = torch.autograd.grad(gathered, (q, k, v), grad_out)
    for name, g, w in zip("qkv", got, want, strict=True):
        assert (g - w).abs().max() < TOLERANCE, name


def test_dense_layer_after_a_cached_prefix_keeps_no_query_by_key_tensor():
    """A dense layer's queries after a cached prefix get the rows of the full causal attention,
    and backward keeps O(T) per head: no (T_q, T) mask (an explicit one made the step's memory
    grow as T^2 again, 1.61x from 2K to 4K tokens in `sparrow-bench distill-attention`)."""
    seq_len, offset = 512, 100
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, seq_len, 8, generator=g).requires_grad_() for _ in range(3))
    meta = SparseForwardMetadata(SparseAttentionConfig(page_size=4, dense_layers=(0,)), None)
    layer = SimpleNamespace(layer_idx=0)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)  # (B, H, T, D)
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: sizes.append(t.numel()) or t, lambda t: t
    ):
        out, _ = sparse_attention.block_sparse_attention(
            layer, q[:, :, offset:], k, v, None, 0.3, sparrow_sparse=meta
        )  # (B, T_q, H, D)
    assert (out.transpose(1, 2) - full[:, :, offset:]).abs().max() < TOLERANCE
    assert max(sizes) < (seq_len - offset) * seq_len / 8  # q, k, v, output, log-sum-exp: T x D
    grad_out = torch.randn_like(out)
    want = torch.autograd.grad(full[:, :, offset:], (q, k, v), grad_out.transpose(1, 2))
    got = torch.autograd.grad(out, (q, k, v), grad_out)
    for name, a, b in zip("qkv", got, want, strict=True):
        assert (a - b).abs().max() < TOLERANCE, name


@pytest.mark.gpu
@pytest.mark.parametrize("group", [1, 3])
def test_cuda_matches_the_cpu_masked_path(group):
    """The same torch function on the GPU: equal to the masked path computed on the CPU."""
    (q, k, v), budgets = _inputs(group, seed=1)
    attn = SparseAttentionConfig(page_size=4)
    ref = masked_sparse_attention(q, k, v, 0.3, SparseForwardMetadata(attn, budgets))
    grad_out = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    on_gpu = [x.detach().cuda().requires_grad_() for x in (q, k, v)]
    out = page_gather_attention(*on_gpu, budgets.cuda(), attn, 0.3, 16)
    grads = torch.autograd.grad(out, on_gpu, grad_out.cuda())
    assert (out.cpu() - ref).abs().max() < TOLERANCE
    for got, want in zip(grads, ref_grads, strict=True):
        assert (got.cpu() - want).abs().max() < TOLERANCE


def test_padding_reads_only_sink_and_recent_pages():
    budget_pages = torch.tensor([[0, 0, 0, 2, 3, 0, 0, 0, 0, 0]])  # (1, 10): 2 tokens, padding
    completion = budget_pages > 0
    dense = query_budgets(budget_pages, completion, page_size=2)
    cheap = query_budgets(budget_pages, completion, page_size=2, padding_pages=2)
    assert dense.tolist() == [[1, 1, 2, 3, 3, 3, 4, 4, 5, 5]]
    # Position 4 (the last token) stays dense; padding after it reads at most 2 pages.
    assert cheap.tolist() == [[1, 1, 2, 3, 3, 2, 2, 2, 2, 2]]


def test_saved_memory_grows_with_budget_not_context():
    """Everything the autograd graph keeps is O(T x budget): no tensor of T^2 elements (the
    masked reference keeps its (G * T, T) mask, so the same probe catches it)."""
    seq_len, attn = 1024, SparseAttentionConfig(page_size=4)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, seq_len, 8, generator=g).requires_grad_() for _ in range(3))
    budgets = torch.full((1, seq_len), 8)  # (B, T) 32 tokens per query

    def largest_saved(fn) -> int:
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, id):
            fn()
        return max(sizes)

    gathered = largest_saved(lambda: page_gather_attention(q, k, v, budgets, attn, 0.3, 64))
    masked = largest_saved(
        lambda: masked_sparse_attention(q, k, v, 0.3, SparseForwardMetadata(attn, budgets))
    )
    assert gathered <= 2 * seq_len * 8  # q, k, v, output: T x D per head
    assert masked >= seq_len * seq_len


@pytest.fixture(scope="module")
def lora_gradients(llama_rollout):
    """(log-probs, adapter gradients) of one loss through the tiny model, with the gathering
    attention in chunks of 5 queries and with the masked reference."""
    batch = llama_rollout.batch
    cfg = DistillConfig(enabled=True, rank=4, alpha=8.0, gate=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        distill = DistillSparse(cfg, llama_rollout.model, llama_rollout.engine.runner.kv.cfg, 1e-3)
        with torch.no_grad():
            for name, p in distill.policy.peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(std=0.1)  # peft starts B at 0, where A gets no gradient
    policy, weights = distill.policy, torch.randn(batch.input_ids.shape)  # (B, T)
    runs = []
    for implementation in (sparse_attention.ATTENTION_NAME, register_reference_attention()):
        policy.model.set_attn_implementation(implementation)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sparse_attention, "query_chunk", lambda *args: 5)
            logprobs, _ = policy.token_logprobs(
                batch.input_ids, batch.completion_mask, batch.budget_pages, temperature=1.0
            )
        grads = torch.autograd.grad((logprobs * weights).sum(), policy.parameters())
        runs.append((logprobs.detach(), grads))
    return runs


def test_lora_gradients_match_the_masked_path(lora_gradients, llama_rollout):
    (gathered_lp, gathered), (masked_lp, masked) = lora_gradients
    mask = llama_rollout.batch.completion_mask
    assert (gathered_lp - masked_lp)[mask].abs().max() < TOLERANCE
    scale = max(float(g.abs().max()) for g in masked)
    assert scale > 1e-2  # the adapter really gets a gradient
    for got, want in zip(gathered, masked, strict=True):
        assert (got - want).abs().max() < TOLERANCE * max(1.0, scale)
