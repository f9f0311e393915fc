"""Unmerged LoRA deltas on the engine's fused linears, added only to the rows a gate selects.

DistillSparse's gated mode (docs/DESIGN.md §1, issue 7): the adapter phi corrects the sparse policy
where attention is sparse, so the engine keeps the dense weights theta in its fused matrices and
phi as low-rank factors beside them. A decode step adds gate * (x A^T) B^T after each decoder
linear, with gate = 1 on the rows whose budget drops pages; prefill and dense rows see W alone.
Merging phi into W instead would change every token, the densely attended ones included.

The fused q/k/v and gate/up matrices take their modules' factors stacked: the A's concatenated
along the rank, the B's block-diagonal, so each fused linear costs two skinny matmuls. A module
without factors (peft targets a subset) is a rank-0 block. B arrives pre-scaled (alpha / r).
"""

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

# Sparrow's fused linear -> the HF modules stacked in it, in row order.
FUSED_MODULES = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}


@dataclass
class LowRankDelta:
    a: Tensor  # (r, in) the stacked down-projections
    b: Tensor  # (out, r) the scaled up-projections, block-diagonal for a fused linear

    def __call__(self, x: Tensor, gate: Tensor) -> Tensor:
        """x (N, in), gate (N,) of 0/1 in x's dtype -> (N, out) gate * (x A^T) B^T."""
        return (x @ self.a.T) @ self.b.T * gate[:, None]  # (N, out)


@dataclass
class LayerLora:
    """One decoder layer's deltas, one per fused linear (names as in LayerWeights)."""

    qkv: LowRankDelta
    o: LowRankDelta
    gate_up: LowRankDelta
    down: LowRankDelta


def build_layer_loras(
    factors: Mapping[str, tuple[Tensor, Tensor]],
    weights: Mapping[str, Tensor],
    num_layers: int,
) -> list[LayerLora]:
    """Per-layer deltas from HF-named factors.

    factors: HF module name (`model.layers.3.self_attn.q_proj`) -> (A (r, in), B scaled (out, r));
    weights: HF weight name -> the engine's tensor for it (for shapes, dtype and device).
    Unknown module names raise KeyError, mismatched shapes ValueError. Copies the factors.
    """
    unknown = sorted(set(factors) - _module_names(num_layers))
    if unknown:
        raise KeyError(f"no LoRA target in the engine for {unknown[:3]} (decoder linears only)")
    layers = []
    for i in range(num_layers):
        deltas = {}
        for fused, modules in FUSED_MODULES.items():
            names = [f"model.layers.{i}.{m}" for m in modules]
            pieces = [_checked(n, factors.get(n), weights[f"{n}.weight"]) for n in names]
            deltas[fused] = LowRankDelta(
                a=torch.cat([a for a, _ in pieces]),  # (sum r, in)
                b=torch.block_diag(*[b for _, b in pieces]),  # (sum out, sum r)
            )
        layers.append(LayerLora(**deltas))
    return layers


def _module_names(num_layers: int) -> set[str]:
    modules = [m for ms in FUSED_MODULES.values() for m in ms]
    return {f"model.layers.{i}.{m}" for i in range(num_layers) for m in modules}


def _checked(
    name: str, pair: tuple[Tensor, Tensor] | None, weight: Tensor
) -> tuple[Tensor, Tensor]:
    """(A, B) in the weight's dtype and device; a rank-0 pair when the module has no factors."""
    out_features, in_features = weight.shape
    if pair is None:
        a, b = weight.new_zeros(0, in_features), weight.new_zeros(out_features, 0)
        return a, b
    a, b = pair
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != in_features or b.shape[0] != out_features:
        raise ValueError(
            f"LoRA {name}: A {tuple(a.shape)}, B {tuple(b.shape)} do not fit a "
            f"({out_features}, {in_features}) weight"
        )
    if a.shape[0] != b.shape[1]:
        raise ValueError(f"LoRA {name}: A has rank {a.shape[0]}, B has rank {b.shape[1]}")
    return a.to(weight.device, weight.dtype), b.to(weight.device, weight.dtype)
