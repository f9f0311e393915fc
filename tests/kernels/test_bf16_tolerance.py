"""The magnitude-scaled bf16 bound the GPU tests use (conftest.close_to_magnitude) is tight
enough to catch lost tokens and loose enough for a real bf16 decode, at Qwen3-1.7B's shapes."""

import pytest
import torch

from sparrow.kernels import paged_decode
from sparrow.kernels.reference import attention_reference

LENS = [300, 97, 33]  # tiny batch of Qwen3-1.7B's heads: 16 q / 8 KV, D 128


def test_bf16_bound_passes_bf16_decode_and_fails_dropped_tokens(
    paged_batch, close_to_magnitude, attention_dropping
):
    batch = paged_batch(LENS, num_kv_heads=8, group=2, head_dim=128, dtype=torch.bfloat16)
    args = (batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.seq_lens)
    expected = attention_reference(*args)  # (B, H_q, D) float64 of the bf16 inputs
    close_to_magnitude(paged_decode(*args, backend="torch"), expected, 2**-6)
    close_to_magnitude(expected.to(torch.bfloat16), expected, 2**-6)  # one rounding passes
    with pytest.raises(AssertionError, match="max error / scale"):
        close_to_magnitude(attention_dropping(batch).to(torch.bfloat16), expected, 2**-6)
