"""The rehearsal harness: sparrow's GPU path run on a fake CUDA device at the real Qwen3-1.7B
shape, through sparrow's own code (engine_rehearsal.py, trainer_rehearsal.py).

`fake_gpu` stacks the pieces: the fake CUDA runtime (fake_cuda.py), `FakeTensorMode`, live bytes
per phase (live_bytes.py), optionally real host values (host_values.py) and the hot-path guard
(hot_path.py), innermost last. Nothing of sparrow's is patched: phases and regions are read off
the Python stack, and the Triton kernels are torch ops with fake implementations
(sparrow/kernels/ops.py).
"""

from contextlib import ExitStack, contextmanager
from types import SimpleNamespace
from unittest import mock

import torch
import transformers
from fake_cuda import fake_cuda_runtime
from host_values import HostValues
from hot_path import HotPathGuard
from live_bytes import LiveBytes
from stack_regions import StackRegions
from torch._subclasses.fake_tensor import FakeTensorMode

from sparrow.models.random_init import random_model_config
from sparrow.train.config import SparrowConfig

# The GPU preset of the headline: rollout=gpu, bf16, Triton (auto on CUDA), CUDA graphs,
# 24,576 KV pages, the tau 0.86 schedule, ZeRO-2 actor with 32K-token micro-batches.
PRESET = ["preset=qwen3_1p7b_gpu"]
MODEL = "qwen3-1.7b"  # sparrow.models.random_init: Qwen3-1.7B's public config, built offline

# What a CUDA graph captures (the decode forward) and the prefill forward: the hot path.
HOT_PATH = StackRegions({
    "decode forward": {("sparrow/rollout/model_runner.py", "_forward")},
    "prefill forward": {("sparrow/rollout/model.py", "prefill")},
})  # fmt: skip
# The LM head's logits are fp32 by contract: the sampler's log-softmax over the vocabulary.
FP32_BY_CONTRACT = {("sparrow/rollout/model.py", "_logits")}
ENGINE_PHASES = StackRegions({
    "prefill": {("sparrow/rollout/model_runner.py", "prefill")},
    "decode": {("sparrow/rollout/model_runner.py", "decode")},
    "sampler": {("sparrow/rollout/sampler.py", "__call__")},
})  # fmt: skip
# Reads of device values the host makes by design, and the value each gets here.
ENGINE_READS = {("sparrow/rollout/engine.py", "_step"): None}  # the sampled tokens, per step
DISTILL_READS = {
    ("sparrow/distill/distill_sparse.py", "step"): None,  # its metrics
    ("sparrow/distill/distill_sparse.py", "_update_adapter"): None,  # the gradient norm
    # The page union of a query chunk: its width sizes the gather. No value exists here, so
    # every page (the slice clamps to them), the most memory the chunk can take.
    ("sparrow/distill/page_gather_attention.py", "_chunk_keys"): 2**31,
}


@contextmanager
def fake_gpu(*, phases: StackRegions | None = None, host_values: bool = False, **guard):
    """The harness, innermost last: fake CUDA runtime, FakeTensorMode, LiveBytes(phases),
    HostValues (optional), HotPathGuard(HOT_PATH, **guard)."""
    with ExitStack() as stack:
        stack.enter_context(fake_cuda_runtime())
        # A deep copy of fake tensors (DistillSparse copies its base model) deep-copies each
        # one's __dict__, its FakeTensorMode included; the copied modes corrupted the heap
        # (the process died at exit). The copies share the mode, as torch's FakeCopyMode does.
        stack.enter_context(mock.patch.object(FakeTensorMode, "__deepcopy__",
                                              lambda mode, memo: mode, create=True))  # fmt: skip
        mode = stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        live = stack.enter_context(LiveBytes(phases))
        values = stack.enter_context(HostValues(mode)) if host_values else None
        kw = dict(allowed_upcasts=FP32_BY_CONTRACT) | guard
        guard = stack.enter_context(HotPathGuard(HOT_PATH, **kw))
        yield SimpleNamespace(mode=mode, live=live, values=values, guard=guard)


def qwen3_model(
    cfg: SparrowConfig, device: str, config: transformers.PretrainedConfig | None = None
) -> transformers.PreTrainedModel:
    """The HF model of Qwen3-1.7B's shape (or of `config`) in the config's dtype, fake, made on
    the CPU and moved to `device` as the trainer moves its model."""
    config = config or random_model_config(MODEL)
    dtype = getattr(torch, cfg.model.dtype)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval().to(device)
