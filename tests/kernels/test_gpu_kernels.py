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
