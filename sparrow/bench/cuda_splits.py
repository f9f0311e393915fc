"""What a GPU launches in decode attention that an interpreter count does not see: the splits.

On CUDA, `paged_decode_triton` spreads each (sequence, KV head) row's pages over several programs
when the rows alone do not fill one wave of resident CTAs (`choose_num_splits`: SM count x CTAs
per SM, from the compiled split kernel's registers and shared memory), and then launches a
second kernel that merges the splits. Under the interpreter (CPU tensors) it never splits, so
`sparrow-bench decode` counted one launch per layer fewer than a GPU makes whenever the GPU
splits. Here the split count a GPU would choose is computed without one: the occupancy comes from
compiling the split kernel for sm_90 (kernels/aot.py: Triton's own ptxas, no driver) in a child
process with the interpreter off, and the SM count is the H200's 132 unless a GPU is present.
"""

import json
import os
import subprocess
import sys

import torch

H200_SMS = 132
_CHILD = """
import json, sys, torch
from sparrow.kernels.aot import KernelVariant, backend_available, compile_variant
from sparrow.kernels.decode_triton import ctas_per_sm, decode_constexprs, default_tiles
dtype, group, head_dim, page_size = sys.argv[1:5]
dtype = getattr(torch, dtype)
tiles = default_tiles(dtype)
names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
out = {}
for dense in (True, False):
    c = decode_constexprs(int(group), int(head_dim), int(page_size), dtype, tiles, dense=dense,
                          split_out=True)
    v = KernelVariant("decode_split", names[dtype], tuple(sorted(c.items())), tiles.num_warps,
                      tiles.num_stages)
    row = compile_variant(v)
    out["dense" if dense else "sparse"] = {
        "regs": row["regs"], "smem_bytes": row["smem_bytes"], "num_warps": tiles.num_warps,
        "pages_per_iter": c["PAGES_PER_ITER"],
        "ctas_per_sm": ctas_per_sm(row["regs"], row["smem_bytes"], tiles.num_warps)}
print(json.dumps(out))
"""


def split_kernel_occupancy(
    dtype: torch.dtype, group: int, head_dim: int, page_size: int, timeout: float = 300
) -> dict | None:
    """{"dense"|"sparse": regs, smem_bytes, num_warps, pages_per_iter, ctas_per_sm} of the split
    kernel (split output) compiled for sm_90, or None when this Triton cannot compile for CUDA."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = [str(dtype).removeprefix("torch."), str(group), str(head_dim), str(page_size)]
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, *args],
            capture_output=True, text=True, env=env, timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0:
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def num_sms() -> int:
    """The present GPU's SM count, else the H200's."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return H200_SMS


def gpu_splits(
    batch: int, num_kv_heads: int, max_slots: int, occupancy: dict, sms: int = H200_SMS
) -> int:
    """The split count `paged_decode_triton` chooses on a GPU with `sms` SMs for `batch`
    sequences whose longest row holds `max_slots` pages (dense: page-table columns; sparse:
    selected slots), at `occupancy` (one of `split_kernel_occupancy`'s entries)."""
    from sparrow.kernels.decode_triton import MAX_SPLITS, choose_num_splits

    ppi = occupancy["pages_per_iter"]
    splits = choose_num_splits(batch * num_kv_heads, max_slots, ppi, sms, occupancy["ctas_per_sm"])
    return max(1, min(splits, MAX_SPLITS, -(-max_slots // ppi)))


def merge_below_batch(num_kv_heads: int, occupancy: dict, sms: int = H200_SMS) -> int:
    """The batch from which rows fill a wave on their own: below it, long rows split and every
    attention call launches the merge too."""
    resident = sms * max(1, occupancy["ctas_per_sm"])
    return -(-resident // num_kv_heads)
