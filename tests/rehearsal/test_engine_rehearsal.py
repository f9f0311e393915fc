"""The engine's GPU path rehearsed on a fake CUDA device (engine_rehearsal.py): the GPU preset
(`preset=qwen3_1p7b_gpu`: rollout=gpu, bf16, Triton via auto on CUDA, 24,576 KV pages, the tau
0.86 schedule) at the real Qwen3-1.7B shape, two prompts of 32K tokens sharing a prefix, 8
samples each (decode batch 16), CUDA graphs on and off, sparse and dense.

`generate` runs through the real scheduler, runner, decode plan, graph capture and sampler; no
op of the prefill or decode forward may make a CPU tensor, read a value back or upcast the bf16
path (hot_path.py), and every Triton kernel is reached as its torch op. What a fake device
cannot check: numerics (no values exist), the kernels themselves (their fake implementations
run the launchers' argument checks, not the kernels), the timing, and what a CUDA graph replay
does (the capture runs the forward once; replays run nothing).
"""

import inspect

import pytest
import torch
import transformers
from engine_rehearsal import rehearse_engine
from hot_path import PLACEHOLDERS

GIB = 2**30
LAYERS, SPARSE_LAYERS = 28, 26  # Qwen3-1.7B; layers 0 and 1 dense
NUM_PAGES = 24576 + 1  # the preset's pool and the padding rows' scratch page
KV_BYTES = 2 * LAYERS * NUM_PAGES * 16 * 8 * 128 * 2  # K and V, 16-token pages, bf16
SUMMARY_BYTES = 2 * LAYERS * NUM_PAGES * 8 * 128 * 2  # Quest's min and max per page, bf16
# What the rehearsal does, counted rather than timed (a wall bound failed on a loaded machine):
# aten ops in the prefill and decode forwards and the sampler, 5,226-6,516 over the four
# configurations (8d8bad3). A per-token or per-page Python loop in the hot path multiplies it.
MAX_HOT_PATH_OPS = 8000


def _token_read_line() -> int:
    """The line of engine.py's step loop that reads the sampled tokens back (its one host read)."""
    import sparrow.rollout.engine as engine

    lines = inspect.getsource(engine).splitlines()
    return 1 + next(i for i, line in enumerate(lines) if "sampled.token_ids.tolist()" in line)


@pytest.mark.parametrize("cuda_graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
def test_engine_generates_on_a_fake_gpu_at_the_real_shape(cuda_graphs, sparse):
    max_tokens = 3
    report = rehearse_engine(cuda_graphs=cuda_graphs, sparse=sparse, max_tokens=max_tokens)
    # The loop ran to the end: 16 samples of 3 tokens, each read back once by the step loop.
    assert report.tokens == [[PLACEHOLDERS["int"]] * max_tokens] * 16
    assert report.host_reads == {
        f"sparrow/rollout/engine.py:{_token_read_line()} (_step)": 16 * max_tokens
    }
    # Every decode forward launched each kernel as its op, once per layer (sparse layers only
    # score and choose pages); no forward reached a Triton launcher with fake tensors.
    ops = report.sparrow_ops
    forwards = ops["write_kv"] // LAYERS
    assert forwards >= max_tokens - 1 and ops["write_kv"] == LAYERS * forwards
    assert ops["paged_decode"] == LAYERS * forwards
    assert ops["page_scores"] == ops["select_pages"] == (SPARSE_LAYERS * forwards if sparse else 0)
    assert ops["qk_norm_rope"] > 0 and ops["silu_mul"] > 0 and ops["add_rms_norm"] > 0
    if cuda_graphs:  # the first decode step captures (and replays), the second replays
        assert report.graphs == (1, max_tokens - 1, 0)
        assert forwards == 3  # two warm-up runs and the capture
    else:
        assert report.graphs is None and forwards == max_tokens - 1
    # Memory: the resident state is what the design says, to the byte but for small tables.
    assert report.kv_bytes == KV_BYTES and report.summary_bytes == SUMMARY_BYTES
    designed = 2 * report.weight_bytes + KV_BYTES + SUMMARY_BYTES  # HF model + engine copy
    assert 0 <= report.resident - designed < 64 * 2**20
    # The 32K prefill holds activations of ~2.6 GiB (fused attention; the math path's scores
    # alone would be 16 GiB); decode at batch 16 a few MiB.
    assert report.peak["prefill"] - report.resident < 4 * GIB
    assert report.peak["decode"] - report.resident < GIB
    assert report.ops_checked < MAX_HOT_PATH_OPS, report.ops_checked
    print(
        f"\n[engine rehearsal graphs={cuda_graphs} sparse={sparse}] GiB: "
        f"resident {report.resident / GIB:.2f} (KV {KV_BYTES / GIB:.2f}, summaries "
        f"{SUMMARY_BYTES / GIB:.2f}, weights 2 x {report.weight_bytes / GIB:.2f}), peaks "
        + ", ".join(f"{k} {v / GIB:.2f}" for k, v in sorted(report.peak.items()))
        + f"; {report.ops_checked} hot-path ops checked"
    )


def _family_configs() -> dict:
    """The other families at a real shape: Qwen2 (q/k/v biases) as DeepSeek-R1-Distill-Qwen-1.5B
    ships it, and Mistral (no biases, no window) at that shape."""
    from sparrow.models.loading import ModelConfig
    from sparrow.models.model_config import read_model_config

    qwen2, _ = read_model_config(ModelConfig(name="deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"))
    fields = {k: getattr(qwen2, k) for k in ("hidden_size", "intermediate_size", "vocab_size")}
    mistral = transformers.MistralConfig(
        **fields,
        num_hidden_layers=qwen2.num_hidden_layers,
        num_attention_heads=qwen2.num_attention_heads,
        num_key_value_heads=qwen2.num_key_value_heads,
        head_dim=qwen2.hidden_size // qwen2.num_attention_heads,
        max_position_embeddings=40960,
        sliding_window=None,
    )
    return {"qwen2": qwen2, "mistral": mistral}


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_other_families_generate_on_a_fake_gpu(family):
    """A new family changes no launch count and no host read of the decode path: each layer
    launches the same ops as Qwen3's (sparse, CUDA graphs), at a 1.5B shape and 32K prompts."""
    config = _family_configs()[family]
    max_tokens = 3
    report = rehearse_engine(cuda_graphs=True, sparse=True, max_tokens=max_tokens,
                             model_config=config)  # fmt: skip
    layers = config.num_hidden_layers
    with torch.device("meta"):  # the family's own weights (Qwen2's q/k/v biases), not Qwen3's
        params = transformers.AutoModelForCausalLM.from_config(config).parameters()
        assert report.weight_bytes == 2 * sum(p.numel() for p in params)  # bf16
    assert report.tokens == [[PLACEHOLDERS["int"]] * max_tokens] * 16
    assert sum(report.host_reads.values()) == 16 * max_tokens
    ops = report.sparrow_ops
    forwards = ops["write_kv"] // layers
    assert forwards == 3 and report.graphs == (1, max_tokens - 1, 0)
    assert ops["paged_decode"] == layers * forwards
    assert ops["page_scores"] == ops["select_pages"] == (layers - 2) * forwards
    assert report.ops_checked < MAX_HOT_PATH_OPS, report.ops_checked
