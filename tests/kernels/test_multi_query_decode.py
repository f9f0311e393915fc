"""Multi-query paged decode (speculative decoding's verify pass): several query rows per sequence,
row j of a sequence attending to its tokens up to its own, read from the pages in place. The C++
kernel and the torch path against the float64 loop reference of one-query decode with a row per
query; the cache holds NaN past every sequence's length, so a row reading a later row's token (a
broken causal limit) or a token past the sequence fails."""

import shutil

import pytest
import torch

from sparrow.kernels import (
    attend_multi_query,
    multi_query_decode_cpu,
    multi_query_plan,
    sparse_decode,
)
from sparrow.kernels.reference import attention_reference

LENS = [200, 37, 16, 120, 1]  # partial, exact and single-token sequences
ROWS = [4, 1, 3, 9, 1]  # query rows per sequence: its last ones


def multi_query_case(paged_batch, group: int, head_dim: int, seed: int = 0):
    batch = paged_batch(LENS, num_kv_heads=2, group=group, head_dim=head_dim, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    seq_of_row = torch.repeat_interleave(torch.arange(len(LENS)), torch.tensor(ROWS))  # (N,)
    row_lens = torch.cat([torch.arange(n - r + 1, n + 1) for n, r in zip(LENS, ROWS, strict=True)])
    q = torch.randn(len(row_lens), batch.q.shape[1], head_dim, generator=gen)  # (N, H_q, D)
    starts = torch.tensor([0, *torch.tensor(ROWS).cumsum(0).tolist()], dtype=torch.int32)
    expected = attention_reference(
        q, batch.k_cache, batch.v_cache, batch.page_table[seq_of_row], row_lens.to(torch.int32)
    )  # (N, H_q, D) float64: a one-query decode row per query
    return batch, q, starts, row_lens.to(torch.int32), seq_of_row, expected


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("head_dim", [64, 128, 32])  # the two compiled head dims and the generic
def test_cpp_multi_query_equals_one_query_rows(paged_batch, group, head_dim):
    batch, q, starts, lens, seq_of_row, expected = multi_query_case(paged_batch, group, head_dim)
    out = multi_query_decode_cpu(
        q, batch.k_cache, batch.v_cache, batch.page_table, starts, lens, scale=head_dim**-0.5
    )
    assert out.shape == q.shape and not out.isnan().any()
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=0)
    # The one-query kernel a dense decode step runs, a row per query: the same to fp32 rounding
    # (each within 2e-6 of the float64 reference, so within 4e-6 of each other).
    one_query = sparse_decode(
        q, batch.k_cache, batch.v_cache, None, batch.page_table[seq_of_row], lens, None,
        backend="cpp",
    )  # fmt: skip
    torch.testing.assert_close(out, one_query, atol=4e-6, rtol=0)


@pytest.mark.parametrize("group", [1, 3])
def test_torch_multi_query_equals_reference(paged_batch, group):
    batch, q, starts, lens, _, expected = multi_query_case(paged_batch, group, 64, seed=3)
    plan = multi_query_plan(
        batch.page_table.clamp(min=0), lens, ROWS, max(LENS), batch.page_size, 2, group
    )
    out = attend_multi_query(q, batch.k_cache, batch.v_cache, plan, 64**-0.5, workspace=None)
    assert out.shape == q.shape and not out.isnan().any()
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=0)
