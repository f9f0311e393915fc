"""Rotary position embedding: inverse frequencies from an HF config, and their application.

Reads the RoPE settings the way transformers 5.x stores them (`config.rope_parameters`, a dict
with `rope_type` and `rope_theta`), falling back to the 4.x fields (`rope_scaling`,
`rope_theta`). "default", "linear" and "llama3" (Llama 3.1's frequency-band rescaling) are
computed here; "yarn" is static too and taken from transformers. Types whose frequencies depend on
the current length ("dynamic", "longrope") are refused: the engine caches K after rotation.
cos/sin are computed per step from the positions (no max-length table to allocate).
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Rope:
    inv_freq: Tensor  # (D/2,) fp32
    attention_scaling: float  # multiplies cos and sin (1.0 except for yarn-like types)

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """positions (N,) int64 -> (cos, cos), (-sin, sin) as (N, 1, D) in `dtype`, broadcast over
        heads: full width with sin's sign folded in, so `apply_rope` is four ops per call."""
        freqs = positions.float()[:, None] * self.inv_freq  # (N, D/2), fp32 as in transformers
        cos = (freqs.cos() * self.attention_scaling).to(dtype)
        sin = (freqs.sin() * self.attention_scaling).to(dtype)
        return torch.cat((cos, cos), -1)[:, None, :], torch.cat((-sin, sin), -1)[:, None, :]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (N, H, D) rotated in halves (the HF `rotate_half` convention), same dtype; cos, sin from
    `Rope.cos_sin`. x1 cos + x2 (-sin) equals HF's x1 cos - x2 sin exactly (negation is exact)."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)  # (N, H, D): (x2, x1)
    return x * cos + swapped * sin


def rope_parameters(config) -> dict:
    params = getattr(config, "rope_parameters", None)
    if params:
        return dict(params)
    scaling = dict(getattr(config, "rope_scaling", None) or {})
    scaling.setdefault("rope_type", scaling.pop("type", "default"))
    scaling["rope_theta"] = getattr(config, "rope_theta", 10_000.0)
    return scaling


def rope_from_config(config, head_dim: int) -> Rope:
    params = rope_parameters(config)
    rope_type = params.get("rope_type", "default")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial rotary embeddings are not supported")
    base = float(params["rope_theta"])
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope_type == "default":
        return Rope(inv_freq, 1.0)
    if rope_type == "linear":
        return Rope(inv_freq / float(params["factor"]), 1.0)
    if rope_type == "llama3":
        params.setdefault("original_max_position_embeddings", config.max_position_embeddings)
        return Rope(_llama3_inv_freq(inv_freq, params), 1.0)
    if rope_type == "yarn":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inv_freq, scaling = ROPE_INIT_FUNCTIONS["yarn"](config, torch.device("cpu"))
        return Rope(inv_freq.float(), float(scaling))
    raise ValueError(
        f"rope_type {rope_type!r} is not supported (default, linear, llama3, yarn are): "
        "length-dependent scalings would change keys already in the cache"
    )


def _llama3_inv_freq(inv_freq: Tensor, params: dict) -> Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate in between."""
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old_len = float(params["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq  # (D/2,)
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)
