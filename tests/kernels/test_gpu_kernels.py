"""Compiled Triton kernels on CUDA against the references (run by scripts/gpu_check.sh).

Needs a process where TRITON_INTERPRET is unset when sparrow's Triton modules are imported; if an
interpreter test module was imported first in the same run, these tests skip with that reason.
"""

import pytest
import torch

from sparrow.bench.kernel import build_layer, parse_args
from sparrow.kernels import paged_decode, select_pages
from sparrow.kernels.reference import attention_reference, select_pages_reference

pytestmark = pytest.mark.gpu

LENS = [700, 1000, 16, 33, 1, 257]  # partial, exact, single-token and one-past-a-page lengths
BUDGETS = [3, 9, 4, 8, 3, 16]  # sparse, sparse, dense, dense (budget > pages), dense, sparse
SHAPES = [(1, 128), (3, 64), (4, 128), (8, 64), (8, 128)]  # (GQA group, head dim)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1.5e-2}


@pytest.fixture(autouse=True)
def compiled_triton():
    from sparrow.kernels import decode_triton, score_triton

    if decode_triton.INTERPRETED or score_triton.INTERPRETED:
        pytest.skip("sparrow's Triton modules were imported under TRITON_INTERPRET=1")


def cpu_args(batch, selected=None):
    """Decode arguments moved to the CPU for the float64 loop reference."""
    tensors = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens)
    moved = [t.cpu() for t in tensors]
    if selected is not None:
        selected = type(selected)(selected.logical_pages.cpu(), selected.num_selected.cpu())
    return (*moved, selected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group,head_dim", SHAPES)
@pytest.mark.parametrize("num_splits", [None, 1, 7])
def test_sparse_and_dense_equal_reference(paged_batch, dtype, group, head_dim, num_splits):
    from sparrow.kernels.decode_triton import paged_decode_triton

    batch = paged_batch(
        LENS, num_kv_heads=2, group=group, head_dim=head_dim, dtype=dtype, device="cuda",
        strided_table=True,
    )  # fmt: skip
    budgets = torch.tensor(BUDGETS, dtype=torch.int32, device="cuda")
    selected = select_pages(batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens)
    for chosen in (selected, None):
        out = paged_decode_triton(*args, chosen, head_dim**-0.5, num_splits=num_splits)
        assert out.dtype == dtype and torch.isfinite(out).all()
        expected = attention_reference(*cpu_args(batch, chosen))
        torch.testing.assert_close(out.cpu().double(), expected, atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_auto_backend_is_triton_and_matches_torch(paged_batch, dtype):
    batch = paged_batch(LENS, num_kv_heads=2, group=4, head_dim=128, dtype=dtype, device="cuda")
    args = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens)
    auto = paged_decode(*args)
    torch.testing.assert_close(auto, paged_decode(*args, backend="triton"), atol=0, rtol=0)
    by_torch = paged_decode(*args, backend="torch")
    torch.testing.assert_close(auto.float(), by_torch.float(), atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize("score", ["quest", "centroid"])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_selection_equals_reference(paged_batch, score, group):
    batch = paged_batch(LENS, num_kv_heads=2, group=group, head_dim=128, device="cuda", seed=group)
    budgets = torch.tensor(BUDGETS, dtype=torch.int32)
    selected = select_pages(
        batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets.cuda(), score=score
    )  # auto: Triton scoring kernel
    summary_cpu = type(batch.summary)(
        batch.summary.k_mean.cpu(), batch.summary.k_min.cpu(), batch.summary.k_max.cpu()
    )
    expected = select_pages_reference(
        batch.q.cpu(),
        summary_cpu,
        batch.page_table.cpu(),
        batch.seq_lens.cpu(),
        budgets,
        score=score,
    )
    counts = selected.num_selected.tolist()
    pages = selected.logical_pages.cpu()
    got = [[pages[b, h, : counts[b]].tolist() for h in range(2)] for b in range(len(LENS))]
    assert got == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_context_matches_torch_backend(dtype):
    """Two 64K-token sequences, 8 KV heads, D 128: many splits and iterations per program."""
    name = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    args = parse_args(["--device", "cuda", "--batch", "2", "--dtype", name])
    layer = build_layer(args, 65536, torch.device("cuda"))
    decode = [layer[k] for k in ("q", "k_cache", "v_cache", "page_table", "seq_lens")]
    budgets = torch.full((2,), 256, dtype=torch.int32, device="cuda")
    selected = select_pages(layer["q"], layer["summary"], *decode[3:], budgets)
    for chosen in (None, selected):
        by_triton = paged_decode(*decode, chosen, backend="triton")
        by_torch = paged_decode(*decode, chosen, backend="torch")
        torch.testing.assert_close(
            by_triton.float(), by_torch.float(), atol=TOLERANCE[dtype], rtol=0
        )


def test_out_of_range_page_id_raises_before_launch(paged_batch):
    batch = paged_batch([40, 20], num_kv_heads=2, group=2, head_dim=64, device="cuda")
    batch.page_table[1, 1] = 10_000
    with pytest.raises(ValueError, match="out of range"):
        paged_decode(batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens)
    torch.cuda.synchronize()  # the context is still healthy: nothing was launched


def test_page_ids_past_int32_element_offsets():
    """Pages above 2^31 / (PAGE_SIZE * H_kv * D) elements need 64-bit offsets in the kernel."""
    num_pages, page_size, kv_heads, dim = 140_000, 16, 8, 128  # 2.3e9 elements per cache
    k_cache = torch.empty(num_pages, page_size, kv_heads, dim, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.empty_like(k_cache)
    table = torch.arange(num_pages - 40, num_pages, device="cuda", dtype=torch.int32).view(2, 20)
    used = table.long().flatten()
    k_cache[used] = torch.randn(40, page_size, kv_heads, dim, device="cuda").bfloat16()
    v_cache[used] = torch.randn(40, page_size, kv_heads, dim, device="cuda").bfloat16()
    q = torch.randn(2, 32, dim, device="cuda").bfloat16()
    lens = torch.tensor([320, 300], dtype=torch.int32, device="cuda")
    args = (q, k_cache, v_cache, table, lens)
    by_triton = paged_decode(*args, backend="triton")
    by_torch = paged_decode(*args, backend="torch")
    torch.testing.assert_close(by_triton.float(), by_torch.float(), atol=1.5e-2, rtol=0)


# --- Qwen3-1.7B decode shapes: 16 q / 8 KV heads (group 2), head dim 128, page 16 -------------

QWEN17_LENS = [1000, 700, 257, 33]
QWEN17_BUDGETS = [24, 9, 8, 3]  # sparse rows, and one with budget >= pages (dense)


def engine_query(batch, num_q_heads, num_kv_heads, head_dim, dtype, seed=7):
    """q as the engine passes it: the first H_q heads of the rotated (N, H_q + H_kv, D) q/k
    tensor, a strided view (row stride (H_q + H_kv) * D)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (batch, num_q_heads + num_kv_heads, head_dim)
    qk = torch.randn(shape, generator=gen, device="cuda").to(dtype)
    return qk[:, :num_q_heads]


def cache_dtype_summary(batch):
    """The engine's Quest summaries: min/max only, in the cache dtype (the fixture's fp32 ones
    rounded: the min/max of bf16/fp16 keys are exact in that dtype)."""
    dtype = batch.k_cache.dtype
    return type(batch.summary)(None, batch.summary.k_min.to(dtype), batch.summary.k_max.to(dtype))


@pytest.mark.parametrize("dtype,rel", [(torch.bfloat16, 2**-6), (torch.float16, 2**-9)])
def test_group2_strided_query_sparse_and_dense(paged_batch, close_to_magnitude, dtype, rel):
    from sparrow.kernels.decode_triton import paged_decode_triton

    batch = paged_batch(QWEN17_LENS, num_kv_heads=8, group=2, head_dim=128, dtype=dtype,
                        device="cuda", strided_table=True)  # fmt: skip
    q = engine_query(len(QWEN17_LENS), 16, 8, 128, dtype)
    assert not q.is_contiguous() and q.stride(0) == 24 * 128
    summary = cache_dtype_summary(batch)
    budgets = torch.tensor(QWEN17_BUDGETS, dtype=torch.int32, device="cuda")
    selected = select_pages(q, summary, batch.page_table, batch.seq_lens, budgets)
    args = (q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens)
    for chosen in (selected, None):
        cpu = [t.cpu() for t in args]
        sel_cpu = (
            None
            if chosen is None
            else type(chosen)(chosen.logical_pages.cpu(), chosen.num_selected.cpu())
        )
        expected = attention_reference(*cpu, sel_cpu)
        for num_splits in (None, 1, 5):  # 1: no merge kernel, the split writes the output
            out = paged_decode_triton(*args, chosen, 128**-0.5, num_splits=num_splits)
            assert out.dtype == dtype and torch.isfinite(out).all()
            close_to_magnitude(out.cpu(), expected, rel)


@pytest.mark.parametrize("group", [2, 4])
def test_bf16_selection_from_cache_dtype_summaries_equals_reference(paged_batch, group):
    batch = paged_batch(QWEN17_LENS, num_kv_heads=8, group=group, head_dim=128,
                        dtype=torch.bfloat16, device="cuda", seed=group)  # fmt: skip
    summary = cache_dtype_summary(batch)
    assert summary.k_mean is None and summary.k_min.dtype == torch.bfloat16
    budgets = torch.tensor(QWEN17_BUDGETS, dtype=torch.int32)
    selected = select_pages(
        batch.q, summary, batch.page_table, batch.seq_lens, budgets.cuda(), score="quest"
    )
    summary_cpu = type(summary)(None, summary.k_min.cpu(), summary.k_max.cpu())
    expected = select_pages_reference(
        batch.q.cpu(), summary_cpu, batch.page_table.cpu(), batch.seq_lens.cpu(), budgets,
        score="quest",
    )  # fmt: skip
    counts = selected.num_selected.tolist()
    pages = selected.logical_pages.cpu()
    got = [[pages[b, h, : counts[b]].tolist() for h in range(8)] for b in range(len(counts))]
    assert got == expected


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_norm_and_rope_round_like_torch(dtype):
    """Compiled kernels round to nearest like torch's ops: equal but for the fp32 sum order
    (at most one step, on under 1% of the elements)."""
    from sparrow.kernels import norm_rope_triton as nr

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (3 * torch.randn(64, 2048, generator=gen, device="cuda")).to(dtype)
    res = torch.randn(64, 2048, generator=gen, device="cuda").to(dtype)
    w = (1 + 0.1 * torch.randn(2048, generator=gen, device="cuda")).to(dtype)
    total, out = nr.add_rms_norm(x, w, 1e-6, res)
    ref_total, ref_out = nr.add_rms_norm_reference(x, w, 1e-6, res)
    assert torch.equal(total, ref_total)
    step = 2**-7 if dtype == torch.bfloat16 else 2**-10
    torch.testing.assert_close(out, ref_out, atol=0, rtol=step)
    assert (out != ref_out).float().mean() < 0.01
    qkv = torch.randn(64, 32, 128, generator=gen, device="cuda").to(dtype)
    qk = qkv[:, :24]  # 16 q + 8 k heads of the fused projection
    wq = (1 + 0.1 * torch.randn(24, 128, generator=gen, device="cuda")).to(dtype)
    pos = torch.arange(64, device="cuda").float()[:, None]
    freqs = pos / (1e6 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))
    cos = torch.cat((freqs.cos(), freqs.cos()), -1).to(dtype)[:, None]
    sin = torch.cat((-freqs.sin(), freqs.sin()), -1).to(dtype)[:, None]
    got = nr.qk_norm_rope(qk, wq, cos, sin, 1e-6)
    ref = nr.qk_norm_rope_reference(qk, wq, cos, sin, 1e-6)
    torch.testing.assert_close(got, ref, atol=2 * step, rtol=step)
    assert (got != ref).float().mean() < 0.01


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decode_step_kernels_match_torch(dtype):
    """The compiled SwiGLU, KV append (+ Quest summaries) and page choice at the 1.7B shapes."""
    from sparrow.kernels import append_kv, silu_mul
    from sparrow.kernels.paged_cache import PageSummary
    from sparrow.kernels.select_triton import select_pages_triton
    from sparrow.kernels.selection import select_from_scores, selection_plan
    from sparrow.kernels.swiglu_triton import silu_mul_reference

    gen = torch.Generator(device="cuda").manual_seed(0)
    gate_up = (3 * torch.randn(64, 2 * 6144, generator=gen, device="cuda")).to(dtype)
    got, ref = silu_mul(gate_up), silu_mul_reference(gate_up)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=2**-7 if dtype != torch.float32 else 1e-5)
    assert (got != ref).float().mean() < 0.01  # rounds like the two torch ops, not just close
    pages, kv_heads = 64, 8
    qkv = torch.randn(16, 32, 128, generator=gen, device="cuda").to(dtype)
    k, v = qkv[:, 16:24], qkv[:, 24:]  # (N, H_kv, D) views of the fused projection
    # One token per page, as a decode step writes (each sequence its own last page).
    page_ids = torch.randperm(pages, generator=gen, device="cuda")[:16]
    slots = page_ids * 16 + torch.randint(0, 16, (16,), generator=gen, device="cuda")
    caches = [torch.randn(pages, 16, kv_heads, 128, generator=gen, device="cuda").to(dtype)
              for _ in range(2)]  # fmt: skip
    summary = PageSummary.empty(pages, kv_heads, 128, "cuda", score="quest", dtype=dtype)
    ref_caches = [c.clone() for c in caches]
    ref_summary = PageSummary(None, summary.k_min.clone(), summary.k_max.clone())
    append_kv(*caches, k, v, slots, summary, backend="triton")
    append_kv(*ref_caches, k, v, slots, ref_summary, backend="torch")
    assert all(torch.equal(a, b) for a, b in zip(caches, ref_caches, strict=True))
    assert torch.equal(summary.k_min, ref_summary.k_min)
    assert torch.equal(summary.k_max, ref_summary.k_max)
    lens = torch.tensor([32768 - 5, 4000, 700, 40] * 4, dtype=torch.int32, device="cuda")
    budgets = torch.full((16,), 128, dtype=torch.int32, device="cuda")
    table = torch.randperm(16 * 2048, device="cuda").view(16, 2048).int()
    scores = torch.randn(16, kv_heads, 2048, generator=gen, device="cuda")
    plan = selection_plan(table, lens, budgets, page_size=16, num_sink=1, num_recent=2)
    rule = dict(page_size=16, num_sink=1, num_recent=2)
    ref_sel = select_from_scores(scores, lens, budgets, plan=plan, **rule)
    sel = select_pages_triton(
        scores, table, lens, budgets, plan.num_selected, plan.max_selected, **rule
    )
    assert torch.equal(sel.logical_pages, ref_sel.logical_pages)
    assert torch.equal(sel.physical_pages, ref_sel.physical_pages)
