"""A contiguous copy of the densely attended layers' K/V for CPU decode, one token longer per step.

The torch backend's paged decode gathers every cached token of a dense layer into one contiguous
(B, H_kv, T, D) buffer at every step, because SDPA needs one: at 4K context x 8 samples that is
~50 MB read and ~50 MB written per layer per step, for one new token per sequence (profile at
batch 16 x 256 tokens: the gather took 13% of `generate`, more than SDPA). Between two decode
steps of the same sequences in the same rows, each one token longer (the usual case, from a
prefill until a sequence finishes), the copy of the previous step is still right but for that
token, so this keeps one copy per layer and writes only the new token into it. Any other step
(the first after a prefill, a sequence finished or was preempted, a copy too small, a layer that
was not dense at the previous step) rebuilds the layer's copy from the pages with one gather.

Memory: a layer's copy never holds more tokens than the page pool (B x capacity <= pool tokens);
a step that would need more uses the gather path. The Triton kernel reads pages in place and never
uses this.
"""

from collections.abc import Callable

import torch
from torch import Tensor

from sparrow.kernels import GatherPlan, gather_kv


class DenseKVCopy:
    def __init__(
        self,
        *,
        pool_tokens: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        grow_tokens: int = 128,
    ):
        self.pool_tokens = pool_tokens
        self.grow_tokens = grow_tokens  # headroom on (re)allocation, so that appends rarely grow it
        self._head = (num_kv_heads, head_dim)
        self._dtype, self._device = dtype, device
        self._copies: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> K, V (rows, H_kv, cap, D)
        self._updated: dict[int, int] = {}  # layer -> the step its copy was last brought up to date
        self._step = 0
        self._last: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # ids, lengths
        self.active = False  # whether this step's dense layers use the copies
        self._appendable = False
        self._batch = self._longest = 0
        # Set by begin_step: (B,) rows, (B,) positions of the new tokens, (B, 1, 1, T) bias.
        self._rows: Tensor | None = None
        self._positions: Tensor | None = None
        self.bias: Tensor | None = None

    def invalidate(self) -> None:
        """Pages were written other than by decode (a prefill): every copy is rebuilt next step."""
        self._last = None

    def begin_step(self, seq_ids: list[int], seq_lens: list[int]) -> None:
        """Called once per decode step with each row's sequence id and cached tokens (the input
        token included), before any layer runs."""
        self._step += 1
        key = (tuple(seq_ids), tuple(seq_lens))
        last, self._last = self._last, key
        self._batch, self._longest = len(seq_ids), max(seq_lens)
        self.active = self._batch * self._longest <= self.pool_tokens
        if not self.active:
            self._last = None
            return
        self._appendable = (
            last is not None
            and last[0] == key[0]
            and all(n == m + 1 for n, m in zip(seq_lens, last[1], strict=True))
        )
        lens = torch.tensor(seq_lens, dtype=torch.int64).to(self._device, non_blocking=True)
        self._rows = torch.arange(self._batch, device=self._device)  # (B,)
        self._positions = lens - 1  # (B,) where each row's new token goes
        visible = torch.arange(self._longest, device=self._device) < lens[:, None]  # (B, T)
        bias = torch.zeros(visible.shape, dtype=torch.float32, device=self._device)
        self.bias = bias.masked_fill_(~visible, -torch.inf)[:, None, None, :]  # (B, 1, 1, T)

    def keys_values(
        self,
        layer: int,
        k: Tensor,
        v: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        plan: Callable[[], GatherPlan],
        workspace: list[Tensor] | None = None,
    ) -> tuple[Tensor, Tensor]:
        """This step's K and V of `layer`, (B, H_kv, T, D) views of its copy, after writing the
        step's k, v (B, H_kv, D) into it (or rebuilding it from the pages that `plan` gathers:
        every page of every row, by `plan()`; the caller wrote k, v into the cache already)."""
        batch, longest = self._batch, self._longest
        copy = self._copies.get(layer)
        fits = copy is not None and copy[0].shape[0] >= batch and copy[0].shape[2] >= longest
        if (
            copy is not None
            and fits
            and self._appendable
            and self._updated.get(layer) == self._step - 1
        ):
            keys, values = copy[0][:batch], copy[1][:batch]
            keys[self._rows, :, self._positions] = k.to(self._dtype)
            values[self._rows, :, self._positions] = v.to(self._dtype)
        else:
            if copy is None or not fits:
                # Zeros: slots past a row's length are read (then masked) and must not hold NaN.
                capacity = min(longest + self.grow_tokens, self.pool_tokens // batch)
                shape = (batch, self._head[0], capacity, self._head[1])
                k_copy, v_copy = (
                    torch.zeros(shape, dtype=self._dtype, device=self._device) for _ in range(2)
                )
                copy = self._copies[layer] = (k_copy, v_copy)
            keys, values = copy[0][:batch], copy[1][:batch]
            gathered = gather_kv(k_cache, v_cache, plan(), workspace)  # (B, H_kv, S * PAGE, D) each
            keys[:, :, :longest].copy_(gathered[0][:, :, :longest])
            values[:, :, :longest].copy_(gathered[1][:, :, :longest])
        self._updated[layer] = self._step
        return keys[:, :, :longest], values[:, :, :longest]
