"""The engine's matrix products (x @ W.T + b): torch's F.linear, or oneDNN with pre-packed weights.

Decode multiplies a few rows (one per sequence) by every weight matrix, so on CPU the step time
is mostly GEMMs, and the LM head alone (vocab x hidden, larger than the L3 cache) is about a
third of them. Re-laying the weights out once in oneDNN's blocked format makes these skinny
GEMMs ~1.3x faster at batch 8-16 on a 2-core AVX2 CPU (the LM head ~1.7x). The price is fp32
reassociation: logits differ from transformers' by up to ~1e-4 instead of ~5e-5, so "torch" (the
default) is the mode that matches HF bit for bit in its GEMMs; "onednn" is opt-in for throughput.
Packed copies live beside the plain weights (which stay the load targets) and are rebuilt by
`repack` after every weight update.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

MODES = ("torch", "onednn")


class Linear:
    def __init__(self, mode: str, batch_hint: int):
        if mode not in MODES:
            raise ValueError(f"linear backend must be one of {MODES}, got {mode!r}")
        if mode == "onednn" and not torch.backends.mkldnn.is_available():
            raise ValueError("linear backend 'onednn' needs a torch build with oneDNN (mkldnn)")
        self.mode = mode
        self.batch_hint = batch_hint  # rows per call the packed layout is tuned for
        self._packed: dict[int, Tensor] = {}  # data_ptr of a plain weight -> its packed copy

    def repack(self, weights: list[Tensor]) -> None:
        """(Re)build the packed copies of `weights` (2-D, on CPU) from their current values."""
        if self.mode != "onednn":
            return
        for w in weights:
            if w.device.type != "cpu" or w.dtype != torch.float32:
                raise ValueError("linear backend 'onednn' needs float32 weights on the CPU")
            self._packed[w.data_ptr()] = torch.ops.mkldnn._reorder_linear_weight(w, self.batch_hint)

    def clear(self) -> None:
        """Drop the packed copies (the engine's sleep frees the weights they were packed from)."""
        self._packed.clear()

    def __call__(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """x (N, in) -> (N, out)."""
        packed = self._packed.get(weight.data_ptr()) if self._packed else None
        if packed is None:
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
