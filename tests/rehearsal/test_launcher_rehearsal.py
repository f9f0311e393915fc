"""The engine's GPU path on the fake CUDA device with the real Triton launchers (launchers.py):
generate on the GPU preset at Qwen3-1.7B's shape runs every launcher on fake tensors, and each
`kernel[grid](...)` is recorded. From the record: the launches per dense and sparse layer of a
decode step at batch 16 and 64 (32K-token prompts), with the split count the launcher chose from
an H200's SM count and the split kernel's sm_90 occupancy; and faults planted in
`paged_decode_triton` (a host sync, a CPU tensor, a wrong-dtype output) fail the rehearsal with
the planted line, also while a CUDA graph is captured.
"""

from collections import Counter
from dataclasses import replace

import pytest
import torch
from engine_rehearsal import shared_prefix_prompts
from harness import ENGINE_PHASES, ENGINE_READS, PRESET, fake_gpu, qwen3_model
from hot_path import RehearsalFault
from launchers import LauncherRecorder
from planted import planted

from sparrow.bench.cuda_splits import H200_SMS, gpu_splits, split_kernel_occupancy
from sparrow.cli.config_loader import load_config
from sparrow.control.controller import make_controller
from sparrow.kernels import decode_triton
from sparrow.models.loading import tiny_tokenizer
from sparrow.rollout.engine import LLMEngine, SamplingParams

DENSE_LAYER = {"_add_rms_norm_kernel": 2, "_qk_norm_rope_kernel": 1, "_write_kv_kernel": 1,
               "_decode_split_kernel": 1, "_silu_mul_kernel": 1}  # fmt: skip
SPARSE_LAYER = DENSE_LAYER | {"_page_score_kernel": 1, "_select_pages_kernel": 1}


@pytest.fixture(scope="module")
def occupancy() -> dict:
    """The bf16 split kernel at Qwen3-1.7B's shape, compiled for sm_90 (Triton caches it)."""
    found = split_kernel_occupancy(torch.bfloat16, group=2, head_dim=128, page_size=16)
    if found is None:
        pytest.skip("this Triton cannot compile for sm_90")
    return found


def rehearse(occupancy: dict, *, num_prompts: int, n: int, context: int, cuda_graphs: bool):
    """generate (max 2 tokens: one decode step) with the real launchers; the recorder."""
    cfg = load_config(PRESET)
    eng = replace(cfg.rollout.engine, cuda_graphs=cuda_graphs)
    regs = {dense: (occupancy[key]["regs"], occupancy[key]["smem_bytes"])
            for dense, key in ((True, "dense"), (False, "sparse"))}  # fmt: skip
    with fake_gpu(phases=ENGINE_PHASES, host_reads_at=ENGINE_READS):
        model = qwen3_model(cfg, "cuda")
        engine = LLMEngine(model, tiny_tokenizer(), eng)
        engine.set_schedule(make_controller(cfg.schedule, cfg.controller).schedule.budget_pages)
        prompts = shared_prefix_prompts(context, num_prompts, model.config.vocab_size)
        params = SamplingParams(temperature=1.0, max_tokens=2, ignore_eos=True)
        with LauncherRecorder(regs) as recorder:
            engine.generate(prompts, params, n=n)
    return recorder, engine


@pytest.mark.parametrize("batch", [16, 64])
def test_launches_per_dense_and_sparse_layer_from_the_record(occupancy, batch):
    recorder, engine = rehearse(occupancy, num_prompts=batch // 8, n=8, context=32768,
                                cuda_graphs=False)  # fmt: skip
    decode = [launch for launch in recorder.launches if launch.phase == "decode"]
    layers = engine.runner.model.shape.num_layers
    per_layer = [Counter(x.kernel for x in decode if x.layer == i) for i in range(layers)]
    dense_layers = set(engine.runner.kv.cfg.dense_layers)
    assert dense_layers == {0, 1} and layers == 28
    # The split count the launcher chose: the grid's third dimension, as cuda_splits computes
    # it for an H200 (dense: every page-table column; sparse: the selection's slots).
    splits = {}
    for i in (0, 2):
        (launch,) = [x for x in decode if x.layer == i and x.kernel == "_decode_split_kernel"]
        assert launch.grid[:2] == (batch, 8)
        splits[i in dense_layers] = launch.grid[2]
    columns = -(-(32768 + 1) // 16 // 16) * 16  # 2049 pages, padded to a multiple of 16
    assert splits[True] == gpu_splits(batch, 8, columns, occupancy["dense"], H200_SMS)
    assert splits[False] == gpu_splits(batch, 8, 128, occupancy["sparse"], H200_SMS)
    for i, launches in enumerate(per_layer):
        dense = i in dense_layers
        expected = Counter(DENSE_LAYER if dense else SPARSE_LAYER)
        expected["_merge_splits_kernel"] = int(splits[dense] > 1)
        assert launches == +expected, (i, launches)
    print(f"\nbatch {batch}: {sum(per_layer[0].values())} launches per dense layer, "
          f"{sum(per_layer[2].values())} per sparse layer; splits {splits}")  # fmt: skip
    assert recorder.ops["paged_decode"] >= layers  # the launchers ran, not the fake kernels


FAULTS = {
    "host sync": ("sel, sel_phys, num_sel = _selection_args(", "seq_lens.max().item()",
                  "host sync (_local_scalar_dense) in the decode forward"),
    "cpu tensor": ("sel, sel_phys, num_sel = _selection_args(",
                   "seq_lens = torch.arange(batch, dtype=torch.int32)",
                   "CPU tensor made in the decode forward (arange)"),
    "wrong-dtype output": ("sel, sel_phys, num_sel = _selection_args(",
                           "out = torch.empty(q.shape, dtype=torch.float32, device=q.device)",
                           "wrong dtype passed to _"),
}  # fmt: skip


@pytest.mark.parametrize("fault", FAULTS)
def test_a_fault_planted_in_the_decode_launcher_names_its_line(occupancy, fault, monkeypatch):
    anchor, statement, what = FAULTS[fault]
    copy, site = planted(decode_triton.paged_decode_triton, anchor, statement)
    monkeypatch.setattr(decode_triton, "paged_decode_triton", copy)
    with pytest.raises(RehearsalFault) as failure:
        rehearse(occupancy, num_prompts=2, n=2, context=600, cuda_graphs=True)  # captured
    message = str(failure.value)
    print(f"\n[{fault}] {message}")
    assert message.startswith(what)
    assert site in message.splitlines()[0]


def test_without_the_recorder_the_planted_host_sync_passes(occupancy, monkeypatch):
    """What the recorder adds: the fake implementation alone never runs the launcher."""
    anchor, statement, _ = FAULTS["host sync"]
    copy, _ = planted(decode_triton.paged_decode_triton, anchor, statement)
    monkeypatch.setattr(decode_triton, "paged_decode_triton", copy)
    cfg = load_config(PRESET)
    with fake_gpu(phases=ENGINE_PHASES, host_reads_at=ENGINE_READS):
        model = qwen3_model(cfg, "cuda")
        engine = LLMEngine(model, tiny_tokenizer(), cfg.rollout.engine)
        prompts = shared_prefix_prompts(600, 2, model.config.vocab_size)
        engine.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True), n=2)
