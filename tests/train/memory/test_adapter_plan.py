"""DistillSparse in the memory plan (sparrow/train/memory/adapter.py): its LoRA counted as peft
builds it, its frozen copy and adapter state resident, its update a phase of its own that the
fit refuses in one line naming distill.micro_batch_size; the GPU check's distill stage settings
fit an H100 where the adapter's default micro-batch does not."""

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model

from sparrow.cli.config_loader import load_config
from sparrow.distill.distill_sparse import DistillConfig
from sparrow.models.loading import tiny_model_config
from sparrow.models.random_init import random_model_config
from sparrow.models.shape import ModelShape
from sparrow.rl.actor_memory import micro_batch_activation_bytes
from sparrow.train.memory.adapter import lora_parameter_count
from sparrow.train.memory.fit import SLEEP, DeviceMemory, MemoryRefused, fit_memory
from sparrow.train.memory.plan import GiB, parameter_count, plan_memory

ROOT = Path(__file__).resolve().parents[3]
TINY = ModelShape.from_hf_config(tiny_model_config("qwen3"))
QWEN17 = ModelShape.from_hf_config(random_model_config("qwen3-1.7b"))
H100 = DeviceMemory(bytes=int(79.2 * GiB), name="NVIDIA H100 80GB HBM3", headroom=0.1)


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"], ["down_proj"]])
@pytest.mark.parametrize("config", [tiny_model_config("llama"), random_model_config("qwen3-1.7b")],
                         ids=["tiny-llama", "qwen3-1.7b"])  # fmt: skip
def test_lora_count_and_dtype_are_pefts(config, targets):
    """On the meta device: no weights allocated. peft keeps a bf16 model's adapter in fp32."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    peft = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets))
    trained = [p for p in peft.parameters() if p.requires_grad]
    shape = ModelShape.from_hf_config(config)
    assert sum(p.numel() for p in trained) == lora_parameter_count(shape, 16, targets)
    assert {p.dtype for p in trained} == {torch.float32}


def gpu_cfg(tokens: int, *overrides: str):
    """The GPU check's step stage config (scripts/gpu_check.sh run_step) at `tokens`."""
    pages = 2 * 8 * (tokens // 16 + 8) + 256
    return load_config([
        "preset=qwen3_1p7b_gpu", "data=arithmetic", f"rollout.max_new_tokens={tokens}",
        f"rollout.engine.num_pages={pages}", "rl.prompts_per_step=2", "rl.group_size=8",
        *overrides,
    ])  # fmt: skip


def test_distill_adds_its_copy_state_and_step_to_the_plan():
    off = plan_memory(gpu_cfg(4096), QWEN17, world=1, on_gpu=True, longest_prompt=64)
    on_cfg = gpu_cfg(4096, "distill=default", "distill.micro_batch_size=1")
    on = plan_memory(on_cfg, QWEN17, world=1, on_gpu=True, longest_prompt=64)
    lora = lora_parameter_count(QWEN17, 16, "all-linear")
    assert on.distill_weights == parameter_count(QWEN17) * 2  # the frozen bf16 copy of theta
    assert on.adapter_state == lora * (4 + 8) + lora * 2  # fp32 LoRA + AdamW; engine's bf16
    for phase, held in off.phases.items():  # every phase holds the copy and the state
        assert on.phases[phase] == held + on.distill_weights + on.adapter_state, phase
    # The update: fp32 gradients and one row's 4097 tokens through the copy, its 4096
    # completion tokens' logits at once, and its prompt's K/V (64 tokens) indexed out.
    activations = micro_batch_activation_bytes(QWEN17, 4097, False, 4096, 2)
    cache = 64 * QWEN17.num_layers * 2 * QWEN17.kv_dim * 2
    assert on.distill_extra == lora * 4 + activations + cache
    base = on.phases["resident"]
    assert on.phases["distill step"] == base + on.distill_extra and "distill step" not in off.phases
    dense = gpu_cfg(4096, "distill=default", "schedule=dense")  # no adapter is built
    assert plan_memory(dense, QWEN17, world=1, on_gpu=True).distill_weights == 0


def test_a_distill_step_over_the_device_is_refused_naming_its_rows():
    """distill=default's 4 rows of 8K tokens need ~184 GiB at the update: refused before
    anything loads, in one line naming distill.micro_batch_size (the actor knobs cannot size
    it), where before the adapter was counted the plan fit and the update ran out of memory."""
    refusal = r"distill step needs .* lower distill.micro_batch_size=4"
    with pytest.raises(MemoryRefused, match=refusal):
        fit_memory(gpu_cfg(8192, "distill=default"), QWEN17, 1, True, H100, longest_prompt=64)


def test_the_gpu_checks_distill_stage_fits_an_h100():
    """The distill stage's own settings (scripts/gpu_check.sh: its tokens and rows) fit an H100,
    the adapter counted; distill.micro_batch_size=1 at 8K tokens would not (~80 GiB) with the
    engine awake, and fits with it asleep (the fit's first knob)."""
    script = (ROOT / "scripts/gpu_check.sh").read_text()
    tokens = int(re.search(r'"\$\{STEP_DISTILL_TOKENS:-(\d+)\}"', script).group(1))
    rows = int(re.search(r"distill.micro_batch_size=\$\{STEP_DISTILL_ROWS:-(\d+)\}", script)[1])
    cfg = gpu_cfg(tokens, "distill=default", f"distill.micro_batch_size={rows}")
    fitted = fit_memory(cfg, QWEN17, 1, True, H100, longest_prompt=64)
    assert fitted.plan.phases["distill step"] <= H100.usable
    one_row = gpu_cfg(8192, "distill=default", "distill.micro_batch_size=1")
    with pytest.raises(MemoryRefused, match="distill step"):
        fit_memory(one_row, QWEN17, 1, True, H100, frozenset({SLEEP}), longest_prompt=64)
    assert fit_memory(one_row, QWEN17, 1, True, H100, longest_prompt=64).changes[0] == f"{SLEEP}=kv"


def test_merged_mode_counts_the_merge_when_larger():
    """gate=false builds theta + phi for the engine after the update (every targeted matrix
    again): at a short rollout that outweighs the micro-batch."""
    cfg = replace(
        load_config(["preset=tiny"]),
        distill=DistillConfig(enabled=True, gate=False, micro_batch_size=1),
    )
    cfg.rollout.max_new_tokens = 1
    plan = plan_memory(cfg, TINY, world=1, on_gpu=False, longest_prompt=2)
    matrices = TINY.num_layers * (
        2 * TINY.hidden_size * TINY.num_q_heads * TINY.head_dim
        + 2 * TINY.hidden_size * TINY.kv_dim
        + 3 * TINY.hidden_size * TINY.intermediate_size
    )
    assert plan.distill_extra == matrices * 4  # fp32 tiny model
