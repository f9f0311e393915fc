"""The kernel benchmark's shapes and tile sweep, shared by `sparrow-bench kernel` (timing) and
its `--aot` table (sparrow/bench/kernel_aot.py), so both cover the same variants."""

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# (pages per iteration, warps, stages). The decode kernel pipelines by hand (two tiles in
# registers), so stages do not change it, and 4+ pages per iteration spill at head dim 128
# (`sparrow-bench kernel --aot` lists registers and spills of each config).
SWEEP = [(ppi, warps, 2) for ppi in (1, 2) for warps in (4, 8)]


def default_shape(gpu: bool) -> dict:
    """GPU: a Qwen3-8B layer (32 q / 8 kv heads, D 128, bf16); CPU: SmolLM2-135M's."""
    return {
        "contexts": [4096, 16384, 65536] if gpu else [1024, 4096],
        "budgets": [512, 2048, 4096] if gpu else [256, 512],
        "batch": 8 if gpu else 4,
        "q_heads": 32 if gpu else 9,
        "kv_heads": 8 if gpu else 3,
        "head_dim": 128 if gpu else 64,
        "dtype": "bf16" if gpu else "fp32",
        "iters": 50 if gpu else 5,
        "page_size": 16,
    }
