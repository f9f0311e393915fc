"""Fused RMSNorm (+ residual) and q/k norm + RoPE kernels under the interpreter against their
torch references (the ops the engine ran before), at Qwen3-1.7B-like head shapes, tiny batch."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from sparrow.kernels import norm_rope_triton as nr  # noqa: E402
from sparrow.kernels.launch_checks import INT32_MAX, check_add_rms_norm  # noqa: E402

if not nr.INTERPRETED:
    pytest.skip("Triton was imported before TRITON_INTERPRET was set", allow_module_level=True)

DTYPES = [torch.bfloat16, torch.float16]
# The interpreter truncates fp32 -> bf16 casts (compiled kernels round to nearest): each of up to
# three roundings (residual sum, before and after the weight) can land one bf16 step (2^-7
# relative) off. fp16 casts round correctly. The GPU test holds the compiled kernel tighter.
RTOL = {torch.bfloat16: 3 * 2**-7, torch.float16: 2**-10}


def _rope(n: int, head_dim: int, dtype):
    """cos, sin (N, 1, D) with the sign folded in, as Rope.cos_sin returns them."""
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.arange(100, 100 + 37 * n, 37).float()[:, None] * inv_freq  # (N, D/2)
    cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
    return torch.cat((cos, cos), -1)[:, None], torch.cat((-sin, sin), -1)[:, None]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("cols", [2048, 200])  # the 1.7B hidden size, and a non-power of 2
def test_add_rms_norm_equals_reference(dtype, residual, cols):
    gen = torch.Generator().manual_seed(cols)
    x = (3 * torch.randn(3, cols, generator=gen)).to(dtype)
    res = torch.randn(3, cols, generator=gen).to(dtype) if residual else None
    w = (1 + 0.1 * torch.randn(cols, generator=gen)).to(dtype)
    total, out = nr.add_rms_norm(x, w, 1e-6, res)
    ref_total, ref_out = nr.add_rms_norm_reference(x, w, 1e-6, res)
    assert out.dtype == dtype and total.dtype == dtype
    torch.testing.assert_close(total, ref_total, atol=0, rtol=RTOL[dtype])
    torch.testing.assert_close(out, ref_out, atol=0, rtol=RTOL[dtype])


@pytest.mark.parametrize("residual", [False, True])
def test_add_rms_norm_reads_each_input_at_its_own_row_stride(residual):
    """x and the residual as views of wider rows (row strides 3 C and 2 C, not C): the launcher
    passes each tensor's row stride, the kernel reads the rows in place; the outputs are
    contiguous. fp16: the interpreter rounds it as a GPU does, so the bound is one step."""
    gen = torch.Generator().manual_seed(5)
    cols = 200
    x = (3 * torch.randn(4, 3 * cols, generator=gen)).half()[:, cols : 2 * cols]
    res = torch.randn(4, 2 * cols, generator=gen).half()[:, :cols] if residual else None
    w = (1 + 0.1 * torch.randn(cols, generator=gen)).half()
    assert x.stride(0) == 3 * cols and (res is None or res.stride(0) == 2 * cols)
    total, out = nr.add_rms_norm(x, w, 1e-6, res)
    ref_total, ref_out = nr.add_rms_norm_reference(x, w, 1e-6, res)
    assert out.is_contiguous() and (res is None or total.is_contiguous())
    torch.testing.assert_close(total, ref_total, atol=0, rtol=RTOL[torch.float16])
    torch.testing.assert_close(out, ref_out, atol=0, rtol=RTOL[torch.float16])


def test_add_rms_norm_refuses_rows_whose_offsets_overflow_int32():
    """The kernel's `row * stride + column` is int32: a layout whose last element lies past it
    is refused before anything is allocated (meta tensors: no memory), the largest that fits
    is not."""
    w = torch.empty(16, dtype=torch.float16, device="meta")
    too_far = torch.empty_strided((2, 16), (INT32_MAX - 14, 1), dtype=torch.float16, device="meta")
    with pytest.raises(ValueError, match="exceeds int32"):
        check_add_rms_norm(too_far, w, None)
    with pytest.raises(ValueError, match="residual.*exceeds int32"):
        check_add_rms_norm(too_far[:, :16].as_strided((2, 16), (16, 1)), w, too_far)
    last_fits = torch.empty_strided((2, 16), (INT32_MAX - 15, 1), dtype=torch.float16,
                                    device="meta")  # fmt: skip
    check_add_rms_norm(last_fits, w, None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", [True, False])
def test_qk_norm_rope_equals_reference_on_the_fused_projection_view(dtype, norm):
    """16 q + 8 k heads of D 128 sliced out of a fused q/k/v row (strided, as the model has it)."""
    gen = torch.Generator().manual_seed(1)
    n, q_heads, kv_heads, d = 3, 16, 8, 128
    qkv = torch.randn(n, q_heads + 2 * kv_heads, d, generator=gen).to(dtype)
    qk = qkv[:, : q_heads + kv_heads]  # (N, 24, D), row stride 32 * D
    w = (1 + 0.1 * torch.randn(q_heads + kv_heads, d, generator=gen)).to(dtype) if norm else None
    cos, sin = _rope(n, d, dtype)
    out = nr.qk_norm_rope(qk, w, cos, sin, 1e-6)
    expected = nr.qk_norm_rope_reference(qk, w, cos, sin, 1e-6)
    assert out.shape == qk.shape and out.is_contiguous()
    # RoPE's sum of two rounded products: near-cancelling sums need an absolute floor.
    torch.testing.assert_close(out, expected, atol=4 * RTOL[dtype], rtol=2 * RTOL[dtype])
    unrotated = nr.qk_norm_rope_reference(qk, w, torch.ones_like(cos), torch.zeros_like(sin), 1e-6)
    assert (out.float() - unrotated.float()).abs().max() > 0.5  # the rotation is applied
