"""The fused C++ CPU decode (selection + attention) against the loop reference and the torch ops."""

import shutil

import pytest
import torch

from sparrow.kernels import (
    SelectedPages,
    decode_cpu,
    resolve_backend,
    sparse_decode,
)
from sparrow.kernels.reference import attention_reference, select_pages_reference

# The kernel builds wherever a C++ compiler is installed (as on CI); without one, auto falls back
# to torch and these tests have nothing to check.
pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")

LENS = [200, 37, 16, 120, 1]  # 13, 3, 1, 8, 1 pages: partial, exact and single-token sequences
BUDGETS = [5, 3, 4, 3, 3]


def reference_selection(batch, budgets, score, num_sink=1, num_recent=2) -> SelectedPages:
    rows = select_pages_reference(
        batch.q, batch.summary, batch.page_table, batch.seq_lens, budgets, score=score,
        page_size=batch.page_size, num_sink=num_sink, num_recent=num_recent,
    )  # fmt: skip
    width = max(len(r) for heads in rows for r in heads)
    logical = torch.zeros(len(rows), len(rows[0]), width, dtype=torch.int32)
    for b, heads in enumerate(rows):
        for h, pages in enumerate(heads):
            logical[b, h, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
    counts = torch.tensor([len(heads[0]) for heads in rows], dtype=torch.int32)
    return SelectedPages(logical, counts)


def cpp_decode(batch, budgets, score="quest", **kw):
    return sparse_decode(
        batch.q, batch.k_cache, batch.v_cache, batch.summary, batch.page_table, batch.seq_lens,
        budgets, score=score, backend="cpp", **kw,
    )  # fmt: skip


@pytest.mark.parametrize("score", ["centroid", "quest"])
@pytest.mark.parametrize("group", [1, 3, 4])
@pytest.mark.parametrize("head_dim", [64, 128, 32])  # the two compiled head dims and the generic
def test_cpp_sparse_equals_reference(paged_batch, poison_unselected, score, group, head_dim):
    batch = paged_batch(LENS, num_kv_heads=2, group=group, head_dim=head_dim, seed=group)
    budgets = torch.tensor(BUDGETS, dtype=torch.int32)
    selected = reference_selection(batch, budgets, score)
    expected = attention_reference(
        batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens, selected
    )
    # Any read of a page the reference rule does not keep now yields NaN.
    poison_unselected(batch, selected.logical_pages, selected.num_selected)
    out = cpp_decode(batch, budgets, score)
    assert out.dtype == torch.float32 and out.shape == batch.q.shape
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=0)


@pytest.mark.parametrize("page_size", [8, 32])
def test_cpp_page_sizes_and_sink_recent(paged_batch, poison_unselected, page_size):
    batch = paged_batch([300, 97], num_kv_heads=3, group=2, head_dim=64, page_size=page_size)
    budgets = torch.tensor([7, 6], dtype=torch.int32)
    selected = reference_selection(batch, budgets, "quest", num_sink=2, num_recent=3)
    expected = attention_reference(
        batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens, selected
    )
    poison_unselected(batch, selected.logical_pages, selected.num_selected)
    out = cpp_decode(batch, budgets, num_sink=2, num_recent=3)
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=0)


def test_cpp_dense_strided_table_and_scale(paged_batch, sdpa_dense):
    batch = paged_batch(LENS, num_kv_heads=2, group=3, head_dim=64, strided_table=True)
    out = cpp_decode(batch, None)  # no budgets: every page
    torch.testing.assert_close(out, sdpa_dense(batch), atol=2e-6, rtol=0)
    scaled = cpp_decode(batch, None, scale=0.05)
    expected = attention_reference(
        batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens, None, scale=0.05
    )
    torch.testing.assert_close(scaled.double(), expected, atol=2e-6, rtol=0)


@pytest.mark.parametrize("score", ["centroid", "quest"])
def test_cpp_equals_torch_backend(paged_batch, score):
    batch = paged_batch([500, 260, 33], num_kv_heads=3, group=3, head_dim=64, seed=7)
    budgets = torch.tensor([8, 6, 8], dtype=torch.int32)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.summary, batch.page_table)
    torch_out = sparse_decode(*args, batch.seq_lens, budgets, score=score, backend="torch")
    torch.testing.assert_close(cpp_decode(batch, budgets, score), torch_out, atol=2e-6, rtol=0)


def test_cpp_checks_inputs(paged_batch):
    batch = paged_batch(LENS, num_kv_heads=2, group=2, head_dim=64)
    bad = batch.page_table.clone()
    bad[0, 0] = batch.k_cache.shape[0]  # one past the pool
    with pytest.raises(ValueError, match="out of range"):
        sparse_decode(
            batch.q, batch.k_cache, batch.v_cache, batch.summary, bad, batch.seq_lens,
            torch.tensor(BUDGETS, dtype=torch.int32), backend="cpp",
        )  # fmt: skip
    with pytest.raises(ValueError, match="fp32"):
        cpp_decode(paged_batch(LENS, 2, 2, 64, dtype=torch.bfloat16), None)


def test_auto_picks_cpp_for_cpu_fp32_only():
    q = torch.zeros(1, 2, 64)
    assert resolve_backend("auto", q) == "cpp"
    assert resolve_backend("auto", q.bfloat16()) == "torch"
    assert resolve_backend("torch", q) == "torch"
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("c++", q)


def test_unavailable_kernel_falls_back_with_reason(monkeypatch, tmp_path):
    q = torch.zeros(1, 2, 64)
    monkeypatch.setattr(decode_cpu, "_state", {})
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert resolve_backend("auto", q) == "torch"
    assert "no-such-compiler" in decode_cpu.cpu_kernel_error()
    with pytest.raises(RuntimeError, match="unavailable: no C\\+\\+ compiler"):
        resolve_backend("cpp", q)
    monkeypatch.setattr(decode_cpu, "_state", {})
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("SPARROW_CPU_KERNEL", "0")
    assert resolve_backend("auto", q) == "torch"


def test_build_is_cached_per_source(monkeypatch, tmp_path):
    monkeypatch.setenv("SPARROW_CACHE", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(decode_cpu, "_state", {})
    assert decode_cpu.cpu_kernel() is not None
    (built,) = (tmp_path / "kernels").glob("decode_cpu-*.so")
    stamp = built.stat().st_mtime_ns
    monkeypatch.setattr(decode_cpu, "_state", {})
    assert decode_cpu.cpu_kernel() is not None  # loads the cached library, builds nothing
    assert list((tmp_path / "kernels").iterdir()) == [built] and built.stat().st_mtime_ns == stamp
    # An edited source is another library.
    source = tmp_path / "decode_cpu.cpp"
    source.write_text(decode_cpu.SOURCE.read_text() + "\n// edited\n")
    monkeypatch.setattr(decode_cpu, "SOURCE", source)
    monkeypatch.setattr(decode_cpu, "_state", {})
    assert decode_cpu.cpu_kernel() is not None
    assert len(list((tmp_path / "kernels").glob("decode_cpu-*.so"))) == 2
