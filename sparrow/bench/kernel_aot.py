"""Every Triton kernel variant sparrow can launch on a GPU, compiled ahead of time for Hopper.

    sparrow-bench kernel --aot --json aot.json     # one row per variant: regs, spills, smem

`aot_variants()` is the single list, used by this benchmark and by the default-suite test
(tests/kernels/test_aot_compile.py). It is derived, not hand-kept: the GPU presets
(conf/preset/*_gpu.yaml: model shape from sparrow.models.random_init, dtype, the rollout group's
engine settings over EngineConfig's defaults) give the engine's shapes, and the kernels'
own constexpr functions (the ones their launchers call) turn shapes into variants; the kernel
sweep's tile configs (sparrow.bench.kernel.SWEEP) at the benchmark's default shape are added.
Compiling needs Triton's CUDA backend and TRITON_INTERPRET unset; no GPU.
"""

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from sparrow.kernels.aot import KernelVariant

CONF = Path(__file__).resolve().parents[2] / "conf"
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@dataclass(frozen=True)
class EngineShape:
    """What the engine's kernels specialise on, for one model and engine config."""

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    qk_norm: bool
    page_size: int
    score: str
    dtype: torch.dtype
    num_sink: int = 1
    num_recent: int = 2


def preset_shapes(conf_dir: Path = CONF) -> list[EngineShape]:
    """The engine shape of every GPU preset (conf/preset/*_gpu.yaml), from the composed config
    (the engine's page size, for one, is interpolated from the schedule's)."""
    from sparrow.cli.config_loader import load_config
    from sparrow.models.model_config import read_model_config
    from sparrow.models.shape import ModelShape

    shapes = []
    for path in sorted((conf_dir / "preset").glob("*_gpu.yaml")):
        cfg = load_config([f"preset={path.stem}"])
        engine = cfg.rollout.engine
        # The preset's model config as a dry run reads it (shipped in models/hf_configs/).
        model = ModelShape.from_hf_config(read_model_config(cfg.model)[0])
        shapes.append(
            EngineShape(
                num_q_heads=model.num_q_heads,
                num_kv_heads=model.num_kv_heads,
                head_dim=model.head_dim,
                hidden_size=model.hidden_size,
                qk_norm=model.qk_norm,
                page_size=engine.page_size,
                score=engine.score,
                dtype=getattr(torch, engine.dtype),
                num_sink=engine.num_sink,
                num_recent=engine.num_recent,
            )
        )
    return shapes


def engine_variants(shape: EngineShape) -> list[KernelVariant]:
    """The variants one engine shape launches: decode dense and sparse (one split writes the
    output, more go through the merge), scoring of the configured mode, the page choice at every
    row width (a power of 2 up to its limit), the KV append and SwiGLU, and for bf16/fp16 the
    fused norms (with and without a residual) and q/k norm + RoPE."""
    from sparrow.kernels import decode_triton as dt
    from sparrow.kernels import kv_write_triton as kw
    from sparrow.kernels import norm_rope_triton as nr
    from sparrow.kernels import score_triton as st
    from sparrow.kernels import select_triton as sl
    from sparrow.kernels import swiglu_triton as sw

    group = shape.num_q_heads // shape.num_kv_heads
    name = DTYPE_NAMES[shape.dtype]
    tiles = dt.default_tiles(shape.dtype)
    out = []
    for dense in (True, False):
        for split_out in (True, False):
            constexprs = dt.decode_constexprs(
                group, shape.head_dim, shape.page_size, shape.dtype, tiles,
                dense=dense, split_out=split_out,
            )  # fmt: skip
            out.append(
                _variant("decode_split", name, constexprs, tiles.num_warps, tiles.num_stages)
            )
    out.append(_variant("merge_splits", name, dt.merge_constexprs(shape.head_dim), 4, 2))
    constexprs = st.score_constexprs(
        group, shape.head_dim, shape.page_size, shape.dtype, shape.score == "quest", False
    )
    out.append(_variant("page_score", name, constexprs, 4, 2))
    width = 16
    while width <= sl.MAX_PAGES:
        rule = (shape.page_size, shape.num_sink, shape.num_recent)
        constexprs = sl.select_constexprs(*rule, width)
        warps = sl.select_num_warps(constexprs["BLOCK_P"])
        out.append(_variant("select_pages", "fp32", constexprs, warps, 2))  # fp32: the scores
        width *= 2
    for summaries in (False, True):  # dense layers write none; sparse ones their score's tables
        constexprs = kw.write_kv_constexprs(
            shape.num_kv_heads, shape.head_dim, shape.page_size,
            mean=summaries and shape.score == "centroid",
            min_max=summaries and shape.score == "quest",
        )  # fmt: skip
        out.append(_variant("write_kv", name, constexprs, 4, 2))
    out.append(_variant("silu_mul", name, sw.silu_mul_constexprs(), 4, 2))
    if shape.dtype != torch.float32:
        for residual in (True, False):
            constexprs = nr.add_rms_norm_constexprs(shape.hidden_size, residual)
            out.append(_variant("add_rms_norm", name, constexprs, 4, 2))
        heads = shape.num_q_heads + shape.num_kv_heads
        constexprs = nr.qk_norm_rope_constexprs(heads, shape.head_dim, shape.qk_norm)
        out.append(_variant("qk_norm_rope", name, constexprs, 4, 2))
    return out


def sweep_variants() -> list[KernelVariant]:
    """The split kernel under each tile config of `sparrow-bench kernel --sweep`, at the
    benchmark's default GPU shape, with and without the merge (short budgets take one split)."""
    from sparrow.bench.kernel_configs import DTYPES, SWEEP, default_shape
    from sparrow.kernels import decode_triton as dt

    shape = default_shape(gpu=True)
    dtype = DTYPES[shape["dtype"]]
    group = shape["q_heads"] // shape["kv_heads"]
    out = []
    for ppi, warps, stages in SWEEP:
        tiles = dt.DecodeTiles(pages_per_iter=ppi, num_warps=warps, num_stages=stages)
        for dense in (True, False):
            for split_out in (True, False):
                constexprs = dt.decode_constexprs(
                    group, shape["head_dim"], shape["page_size"], dtype, tiles,
                    dense=dense, split_out=split_out,
                )  # fmt: skip
                out.append(_variant("decode_split", shape["dtype"], constexprs, warps, stages))
    return out


def aot_variants() -> list[KernelVariant]:
    """Every distinct variant of the presets' engines (and of the engine's other dtypes) and of
    the kernel sweep, in a stable order."""
    shapes = preset_shapes()
    # The engine also runs fp16 and fp32 (EngineConfig.dtype): those at the first preset's shape.
    shapes += [replace(shapes[0], dtype=dtype) for dtype in (torch.float16, torch.float32)]
    variants = [v for shape in shapes for v in engine_variants(shape)]
    variants += sweep_variants()
    return list(dict.fromkeys(variants))


def compile_all(variants: list[KernelVariant], workers: int | None = None) -> list[dict]:
    """Compile each variant (in parallel processes) and return their rows, in order."""
    from sparrow.kernels.aot import compile_variant

    workers = workers or min(4, os.cpu_count() or 1)
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(compile_variant, variants))


def _variant(kernel: str, dtype: str, constexprs: dict, warps: int, stages: int) -> KernelVariant:
    return KernelVariant(kernel, dtype, tuple(sorted(constexprs.items())), warps, stages)
