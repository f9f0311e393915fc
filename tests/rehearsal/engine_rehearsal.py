"""The engine's GPU path on a fake CUDA device: `LLMEngine.generate` on the GPU preset at the real
Qwen3-1.7B shape (harness.py), with what it held per phase, read back and launched.
"""

from collections import Counter
from dataclasses import dataclass, field, replace

from harness import ENGINE_PHASES, ENGINE_READS, PRESET, fake_gpu, qwen3_model

from sparrow.cli.config_loader import load_config
from sparrow.control.controller import make_controller
from sparrow.models.loading import tiny_tokenizer
from sparrow.rollout.engine import LLMEngine, SamplingParams


def shared_prefix_prompts(context: int, num_prompts: int, vocab: int) -> list[list[int]]:
    """`num_prompts` prompts of `context` tokens that share all but their last 60 (a few-shot
    prefix: the engine computes it once)."""
    prefix = [3 + (i * 7919) % (vocab - 3) for i in range(context - 60)]
    return [prefix + [3 + p] * 60 for p in range(num_prompts)]


@dataclass
class EngineReport:
    resident: int  # CUDA bytes held once the engine is built (HF weights + the engine's state)
    weight_bytes: int  # of which the HF model's weights (the engine holds its own copy)
    kv_bytes: int  # of which the paged K/V cache
    summary_bytes: int  # and the page summaries
    peak: dict[str, int]  # phase -> most CUDA bytes held while in it (ENGINE_PHASES)
    host_reads: Counter  # site -> values read back
    sparrow_ops: Counter  # Triton kernel op -> calls
    graphs: tuple[int, int, int] | None  # (captured, replayed, eager) with CUDA graphs
    ops_checked: int  # ops run in the hot path under the guard
    tokens: list[list[int]] = field(default_factory=list)


def rehearse_engine(
    *,
    cuda_graphs: bool,
    sparse: bool,
    context: int = 32768,
    num_prompts: int = 2,
    n: int = 8,
    max_tokens: int = 3,
    model_config=None,
) -> EngineReport:
    """`LLMEngine.generate` of `num_prompts` x `n` samples of `max_tokens` tokens from prompts
    of `context` tokens sharing a prefix, on the GPU preset's engine with `cuda_graphs`, sparse
    (the preset's schedule) or dense. The step loop reads its sampled tokens back: each gets
    the placeholder token id (hot_path.PLACEHOLDERS). `model_config`: another model's HF config
    (default: Qwen3-1.7B's)."""
    cfg = load_config(PRESET)
    eng = replace(cfg.rollout.engine, cuda_graphs=cuda_graphs)
    with fake_gpu(phases=ENGINE_PHASES, host_reads_at=ENGINE_READS) as h:
        model = qwen3_model(cfg, "cuda", model_config)
        engine = LLMEngine(model, tiny_tokenizer(), eng)
        resident = h.live.live["cuda"]
        kv = engine.runner.kv
        schedule = make_controller(cfg.schedule, cfg.controller).schedule if sparse else None
        engine.set_schedule(None if schedule is None else schedule.budget_pages)
        prompts = shared_prefix_prompts(context, num_prompts, model.config.vocab_size)
        params = SamplingParams(temperature=cfg.rollout.temperature, max_tokens=max_tokens,
                                ignore_eos=True)  # fmt: skip
        outputs = engine.generate(prompts, params, n=n)
        graphs = engine.runner.graphs
        graph_counts = graphs and (graphs.num_captured, graphs.num_replayed, graphs.num_eager)
        # The sparse layers' summaries are views of one table per kind (all layers x pages).
        tables = {id(t.untyped_storage()): t.untyped_storage().nbytes()
                  for s in kv.summaries if s is not None for t in s.tables}  # fmt: skip
        return EngineReport(
            resident=resident,
            kv_bytes=kv.k.nbytes + kv.v.nbytes,
            summary_bytes=sum(tables.values()),
            weight_bytes=sum(p.nbytes for p in model.parameters()),
            peak={name: c["cuda"] for name, c in h.live.peak_in.items()},
            host_reads=h.guard.host_reads,
            sparrow_ops=h.guard.sparrow_ops,
            graphs=graph_counts,
            ops_checked=h.guard.ops_checked,
            tokens=[o.token_ids for o in outputs],
        )
