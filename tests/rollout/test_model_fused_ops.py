"""The model's fused RMSNorm (+ residual), q/k norm + RoPE (bf16/fp16) and SwiGLU kernels (used
with the Triton backend) against its torch path, on CPU through the Triton interpreter: the same
forward either way."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import sparrow.rollout.model as model_module
from sparrow.rollout.model import DecoderModel


@pytest.fixture(autouse=True)
def interpreted_kernels():
    from sparrow.kernels import norm_rope_triton

    if not norm_rope_triton.INTERPRETED:
        pytest.skip("the fused kernels run on CPU only under TRITON_INTERPRET=1")


def causal_attend(layer, q, k, v):
    """Dense causal attention over the N tokens of one sequence: (N, H, D) in, (N, H_q, D) out."""
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        is_causal=True, enable_gqa=True,
    )  # fmt: skip
    return o[0].transpose(0, 1)


@pytest.mark.parametrize("family", ["tiny_qwen3", "tiny_llama"])
def test_fused_forward_equals_torch_forward(family, request):
    lm = request.getfixturevalue(family)
    model = DecoderModel(lm.model.config, lm.model.state_dict(), torch.bfloat16, "cpu")
    assert not model.fused_norm_rope and not model.fused_silu_mul  # CPU: the torch ops by default
    ids = torch.randint(
        3, lm.model.config.vocab_size, (11,), generator=torch.Generator().manual_seed(0)
    )
    positions = torch.arange(11)
    torch_hidden = model._forward(ids, positions, causal_attend)  # (N, hidden)
    model.fused_norm_rope = model.fused_silu_mul = True
    fused_hidden = model._forward(ids, positions, causal_attend)
    # The interpreter truncates bf16 casts (compiled kernels round): a few bf16 steps apart.
    scale = torch_hidden.float().abs().max()
    err = (fused_hidden.float() - torch_hidden.float()).abs().max()
    assert err <= 0.03 * scale, (err, scale)
    # Each layer's residual stream carries a norm of a different size: dropping a residual or a
    # weight would move the output by O(scale), far past the tolerance.
    assert torch.isfinite(fused_hidden).all() and scale > 0


class KernelOpCounter(TorchDispatchMode):
    """Counts aten ops that launch a kernel (allocations and views launch none)."""

    FREE = ("empty", "view", "slice", "t.", "transpose", "unsqueeze", "expand", "split", "alias")

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func).removeprefix("aten.")
        self.count += not name.startswith(self.FREE)
        return func(*args, **(kwargs or {}))


def test_fused_path_cuts_the_ops_of_norms_rope_and_residuals(tiny_qwen3, monkeypatch):
    """Four fused launches replace the ~32 ops of three bf16 RMSNorms, RoPE, the two residual
    adds and SwiGLU per layer (the kernels are stubbed: only what the model itself launches)."""
    launches = []

    def norm_stub(x, weight, eps, residual=None):
        launches.append("add_rms_norm")
        return (x if residual is None else torch.empty_like(x)), torch.empty_like(x)

    def rope_stub(qk, weight, cos, sin, eps):
        launches.append("qk_norm_rope")
        return torch.empty(qk.shape, dtype=qk.dtype)

    def silu_stub(gate_up):
        launches.append("silu_mul")
        return torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=gate_up.dtype)

    monkeypatch.setattr(model_module, "silu_mul", silu_stub)
    monkeypatch.setattr(model_module, "add_rms_norm", norm_stub)
    monkeypatch.setattr(model_module, "qk_norm_rope", rope_stub)
    config = tiny_qwen3.model.config
    model = DecoderModel(config, tiny_qwen3.model.state_dict(), torch.bfloat16, "cpu")
    layers = model.shape.num_layers
    ids, positions = torch.tensor([5, 6, 7]), torch.arange(3)
    per_layer = {}
    for fused in (False, True):
        model.fused_norm_rope = model.fused_silu_mul = fused
        launches.clear()
        with KernelOpCounter() as counter:
            model._forward(ids, positions, lambda layer, q, k, v: q)
        per_layer[fused] = (counter.count + len(launches)) / layers
    # input norm (+ residual), post norm + residual, q/k norm + RoPE, SwiGLU
    assert len(launches) == 4 * layers
    # fused: 11.25 (the four kernels, the projections as this counter sees them, the embedding
    # and head spread over the layers); an unfused SwiGLU alone would add one per layer
    assert per_layer[False] >= 37 and per_layer[True] <= 11.5, per_layer
