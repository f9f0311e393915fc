"""The fused SwiGLU activation and the one-launch KV append under the interpreter against their
torch references (the ops the engine runs on CPU)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from sparrow.kernels import append_kv, kv_write_triton, swiglu_triton, write_kv  # noqa: E402
from sparrow.kernels.launch_checks import INT32_MAX, check_silu_mul  # noqa: E402

if not (swiglu_triton.INTERPRETED and kv_write_triton.INTERPRETED):
    pytest.skip("Triton was imported before TRITON_INTERPRET was set", allow_module_level=True)

# The interpreter truncates fp32 -> bf16 casts (compiled kernels round to nearest): each of the
# two roundings can land one bf16 step off. fp16 casts round correctly; fp32 has none.
RTOL = {torch.float32: 1e-6, torch.bfloat16: 2 * 2**-7, torch.float16: 2**-10}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("inter", [6144, 1000])  # the 1.7B MLP (6 blocks), a ragged last block
def test_silu_mul_equals_reference(dtype, inter):
    gen = torch.Generator().manual_seed(inter)
    gate_up = (3 * torch.randn(3, 2 * inter, generator=gen)).to(dtype)
    out = swiglu_triton.silu_mul(gate_up)
    expected = swiglu_triton.silu_mul_reference(gate_up)
    assert out.shape == (3, inter) and out.dtype == dtype
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=RTOL[dtype])


def test_silu_mul_uses_gate_then_up():
    """Swapping the halves changes the result (silu is not symmetric): the kernel reads the gate
    from the first half, as the model stacks gate_proj above up_proj."""
    gate_up = torch.tensor([[2.0, -1.0, 0.5, 3.0]])  # gate (2, -1), up (0.5, 3)
    out = swiglu_triton.silu_mul(gate_up)
    expected = torch.nn.functional.silu(torch.tensor([2.0, -1.0])) * torch.tensor([0.5, 3.0])
    torch.testing.assert_close(out[0], expected)


def test_silu_mul_reads_gate_up_at_its_row_stride():
    """gate_up as a view of wider rows (row stride 3 I, not 2 I): the launcher passes the row
    stride, the kernel reads gate then up of each row in place; the output is contiguous."""
    gen = torch.Generator().manual_seed(2)
    inter = 1000
    gate_up = (3 * torch.randn(3, 3 * inter, generator=gen))[:, inter:]  # (N, 2 I), stride 3 I
    assert gate_up.stride(0) == 3 * inter
    out = swiglu_triton.silu_mul(gate_up)
    assert out.is_contiguous()
    expected = swiglu_triton.silu_mul_reference(gate_up)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=RTOL[torch.float32])


def test_silu_mul_refuses_rows_whose_offsets_overflow_int32():
    """`row * stride + column` is int32 in the kernel: refused before launch (meta tensors)."""
    too_far = torch.empty_strided((2, 32), (INT32_MAX - 30, 1), dtype=torch.bfloat16,
                                  device="meta")  # fmt: skip
    with pytest.raises(ValueError, match="exceeds int32"):
        check_silu_mul(too_far)
    check_silu_mul(torch.empty_strided((2, 32), (INT32_MAX - 31, 1), device="meta"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kv_heads", [8, 3])  # the 1.7B model, and a non-power of 2
def test_write_kv_equals_torch_from_the_fused_projection(dtype, kv_heads):
    """k and v as the model hands them over: strided views of the fused q/k/v rows. Exactly the
    torch index copies, every other slot untouched."""
    gen = torch.Generator().manual_seed(kv_heads)
    n, q_heads, d, pages, page_size = 4, 2 * kv_heads, 64, 6, 16
    qkv = torch.randn(n, q_heads + 2 * kv_heads, d, generator=gen).to(dtype)
    k, v = qkv[:, q_heads : q_heads + kv_heads], qkv[:, q_heads + kv_heads :]  # (N, H_kv, D)
    slots = torch.tensor([5, 17, 95, 40])  # page 0, 1, last slot of page 5, page 2
    k_cache = torch.randn(pages, page_size, kv_heads, d, generator=gen).to(dtype)
    v_cache = torch.randn(pages, page_size, kv_heads, d, generator=gen).to(dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv(k_ref, v_ref, k, v, slots)
    append_kv(k_cache, v_cache, k, v, slots, backend="triton")
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    assert torch.equal(k_cache.view(-1, kv_heads, d)[slots], k)  # the new rows are in place


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("score", ["quest", "centroid"])
def test_write_kv_refreshes_the_written_pages_summaries(dtype, score):
    """With the layer's summary tables (in the cache dtype, as the engine keeps them for Triton),
    each written page's row is what `update_page_summaries` computes from the page's first
    offset + 1 tokens: a fresh page (offset 0), a half page, a full page; other rows untouched."""
    from sparrow.kernels.paged_cache import PageSummary

    gen = torch.Generator().manual_seed(11)
    kv_heads, d, pages, page_size = 2, 32, 5, 8
    qkv = torch.randn(3, 4 * kv_heads, d, generator=gen).to(dtype)
    k, v = qkv[:, 2 * kv_heads : 3 * kv_heads], qkv[:, 3 * kv_heads :]  # (N, H_kv, D) views
    slots = torch.tensor([1 * 8 + 0, 3 * 8 + 4, 4 * 8 + 7])  # pages 1, 3, 4 at offsets 0, 4, 7
    k_cache = torch.randn(pages, page_size, kv_heads, d, generator=gen).to(dtype)
    v_cache = torch.randn(pages, page_size, kv_heads, d, generator=gen).to(dtype)
    summary = PageSummary.empty(pages, kv_heads, d, "cpu", score=score, dtype=dtype)
    for t in summary.tables:
        t.normal_(generator=gen)
    before = [t.clone() for t in summary.tables]
    caches_ref = (k_cache.clone(), v_cache.clone())
    summary_ref = PageSummary(*(None if t is None else t.clone() for t in
                                (summary.k_mean, summary.k_min, summary.k_max)))  # fmt: skip
    append_kv(*caches_ref, k, v, slots, summary_ref, backend="torch")
    append_kv(k_cache, v_cache, k, v, slots, summary, backend="triton")
    assert torch.equal(k_cache, caches_ref[0]) and torch.equal(v_cache, caches_ref[1])
    untouched = [0, 2]
    for got, ref in zip(summary.tables, summary_ref.tables, strict=True):
        if score == "quest":
            assert torch.equal(got, ref)  # min/max: exact
        else:  # the centroid: an fp32 sum in another order, rounded to the table's dtype
            torch.testing.assert_close(got, ref, atol=1e-6, rtol=RTOL[dtype])
        assert torch.equal(got[untouched], ref[untouched])
    for got, old in zip(summary.tables, before, strict=True):  # every written row changed
        assert all(not torch.equal(got[p], old[p]) for p in (1, 3, 4))


def test_write_kv_rejects_a_non_contiguous_cache():
    cache = torch.zeros(2, 16, 2, 2, 16)[:, :, :, 0]  # (2, 16, 2, 16) strided
    k = torch.zeros(1, 2, 16)
    with pytest.raises(ValueError, match="contiguous"):
        kv_write_triton.write_kv(cache, cache, k, k, torch.tensor([0]))
