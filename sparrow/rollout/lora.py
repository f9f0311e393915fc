"""Unmerged LoRA deltas on the engine's fused linears: DistillSparse's, added only to the rows a
gate selects, and the policy's (LoRA RL, actor.lora), added to every row of every forward.

DistillSparse's gated mode (docs/DESIGN.md §1, issue 7): the adapter phi corrects the sparse policy
where attention is sparse, so the engine keeps the dense weights theta in its fused matrices and
phi as low-rank factors beside them. A decode step adds gate * (x A^T) B^T after each decoder
linear, with gate = 1 on the rows whose budget drops pages; prefill and dense rows see W alone.
Merging phi into W instead would change every token, the densely attended ones included.

The policy adapter of a LoRA RL run (docs/DESIGN.md, "LoRA RL of the policy") takes the same
form, ungated: prefill, dense and sparse decode, score and verify all add it, so the engine's
policy is the actor's W x + s B A x at every token. Both may be set: a sparse decode row then adds
both deltas (the distilled phi corrects the adapted policy, which is what it was trained on top of).

The fused q/k/v and gate/up matrices take their modules' factors stacked: the A's concatenated
along the rank, the B's block-diagonal, so each fused linear costs two skinny matmuls. A module
without factors (peft targets a subset) is a rank-0 block. B arrives pre-scaled (alpha / r).
"""

from collections.abc import Iterator, Mapping
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

# Suffixes of an adapter's tensors in a weight push: A, and B pre-multiplied by alpha / r.
WIRE_A, WIRE_B = ".lora_A", ".lora_B"


@dataclass
class LowRankDelta:
    a: Tensor  # (r, in) the stacked down-projections
    b: Tensor  # (out, r) the scaled up-projections, block-diagonal for a fused linear

    def __call__(self, x: Tensor, gate: Tensor | None = None) -> Tensor:
        """x (N, in), gate (N,) of 0/1 in x's dtype -> (N, out) gate * (x A^T) B^T; no gate:
        every row."""
        delta = (x @ self.a.T) @ self.b.T  # (N, out)
        return delta if gate is None else delta * gate[:, None]


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


def copy_layer_loras(target: list[LayerLora], source: list[LayerLora]) -> bool:
    """Copy `source`'s factors into `target`'s tensors in place (a captured CUDA graph keeps
    reading them); False, nothing copied, when a shape differs (the caller replaces them)."""
    pairs = [
        (getattr(t, f), getattr(s, f))
        for t, s in zip(target, source, strict=True)
        for f in FUSED_MODULES
    ]
    if any(t.a.shape != s.a.shape or t.b.shape != s.b.shape for t, s in pairs):
        return False
    for t, s in pairs:
        t.a.copy_(s.a)
        t.b.copy_(s.b)
    return True


def wire_tensors(adapter: Mapping[str, tuple[Tensor, Tensor]]) -> Iterator[tuple[str, Tensor]]:
    """`factors` as the (name, tensor) pairs of a weight push: `<module>.lora_A`, `.lora_B`."""
    for name, (a, b) in adapter.items():
        yield name + WIRE_A, a
        yield name + WIRE_B, b


def from_wire(tensors: Mapping[str, Tensor]) -> dict[str, tuple[Tensor, Tensor]]:
    """`wire_tensors`' pairs back as factors (raises on a name that is not an adapter's)."""
    out: dict[str, list[Tensor | None]] = {}
    for name, tensor in tensors.items():
        for i, suffix in enumerate((WIRE_A, WIRE_B)):
            if name.endswith(suffix):
                out.setdefault(name.removesuffix(suffix), [None, None])[i] = tensor
                break
        else:
            raise KeyError(f"pushed tensor {name!r} is no adapter factor")
    incomplete = sorted(name for name, pair in out.items() if None in pair)
    if incomplete:
        raise KeyError(f"adapter push lacks A or B of {incomplete[:3]}")
    return {name: (pair[0], pair[1]) for name, pair in out.items()}  # type: ignore[misc]
