"""Launches per layer of one engine decode step on the Triton path (`sparrow-bench decode`'s
count), in the interpreter at small shapes: the ops per layer do not depend on them. bf16 is
the GPU presets' dtype: <= 12 launches per sparse layer, the issue's goal (49 before the fused
SwiGLU, KV append and page choice; 12 of them: two norms, q/k norm + RoPE, four projections,
SwiGLU, KV append, scoring, page choice, decode)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from sparrow.bench.decode import count_step  # noqa: E402
from sparrow.bench.random_runner import advance, prefilled_runner, qwen3_1p7b_shaped  # noqa: E402
from sparrow.kernels import decode_triton, select_triton  # noqa: E402

if not (decode_triton.INTERPRETED and select_triton.INTERPRETED):
    pytest.skip("Triton was imported before TRITON_INTERPRET was set", allow_module_level=True)


def test_triton_bf16_decode_step_launches_per_layer():
    dtype = torch.bfloat16
    config = qwen3_1p7b_shaped(layers=3)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 4, 2, 16
    runner, seqs, bm = prefilled_runner(config, dtype, "triton", [19], page_size=4)  # 5 pages
    advance(seqs, bm, runner.decode(seqs, [4], update_summaries=True))  # warm
    sparse = count_step(runner, seqs, [4])
    advance(seqs, bm, sparse.pop("logits"))
    dense = count_step(runner, seqs, None)
    ops = sparse["ops_of_a_sparse_layer"]
    assert sparse["syncs_in_layers"] == 0 and dense["syncs_in_layers"] == 0
    for kernel in ("_write_kv_kernel", "_page_score_kernel", "_select_pages_kernel",
                   "_decode_split_kernel", "_silu_mul_kernel"):  # fmt: skip
        assert ops[f"triton:{kernel}"] == 1, ops
    assert sparse["per_layer_sparse"] <= 12, ops
    assert dense["per_layer_dense"] <= 10
    assert set(ops) == {f"triton:{k}" for k in (
        "_add_rms_norm_kernel", "_qk_norm_rope_kernel", "_write_kv_kernel",
        "_page_score_kernel", "_select_pages_kernel", "_decode_split_kernel",
        "_silu_mul_kernel")} | {"linear"}  # fmt: skip
