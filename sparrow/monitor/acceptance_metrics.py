"""The step's acceptance metrics: per position bin, of the sparse rollout against the dense
policy (the exact full-vocabulary acceptance where it was measured, the paper's top-K bound
always beside it), and of the dense-vs-dense noise floor; plus the per-bin stats the controller
reads. Ranks pool their tokens before percentiles.
"""

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from sparrow.control.acceptance import (
    BinStats,
    bin_acceptance,
    flatten_completion,
    topk_acceptance_bound,
)
from sparrow.distributed import Ranks
from sparrow.rl.batch import RolloutBatch


@dataclass
class ExactAcceptance:
    values: Tensor  # (b, T) exact acceptance of the measured rows, 0 off their completion
    rows: Tensor  # (B,) bool, the rows of the batch they belong to (b = rows.sum())


@dataclass
class AcceptanceResult:
    metrics: dict[str, float]  # accept/..., accept_topk/..., noise_floor/...
    stats: list[BinStats]  # the sparse policy's per-bin stats, the controller's input
    histograms: dict[str, list[float]] = field(default_factory=dict)  # per-token, for W&B


def topk_bound(batch: RolloutBatch, dense) -> Tensor:
    """(B, T) the paper's top-K lower bound of the acceptance, 0 off the completion."""
    mask = batch.completion_mask
    bound = torch.zeros(mask.shape)  # (B, T)
    bound[mask] = topk_acceptance_bound(
        batch.topk_ids[mask],
        batch.topk_logprobs[mask],
        dense.topk_ids[mask],
        dense.topk_logprobs[mask],
    )
    return bound


class AcceptanceMetrics:
    """Bins per-token acceptance, pooled over ranks, into metrics and the controller's stats."""

    def __init__(self, bin_tokens: int, ranks: Ranks):
        self.bin_tokens = bin_tokens
        self.ranks = ranks

    def measure(
        self, batch: RolloutBatch, dense, floor_rows: Tensor, exact: ExactAcceptance | None
    ) -> AcceptanceResult:
        """`dense`: the dense policy's top-K of the batch; `floor_rows` (B,) bool, the rows rolled
        out densely (noise floor, kept out of the stats); `exact`: the exact acceptance where it
        was measured (None: the controller reads the top-K bound)."""
        mask = batch.completion_mask
        bound = topk_bound(batch, dense)  # (B, T)
        result = AcceptanceResult({}, [])
        result.metrics |= self._bins("accept_topk", bound, mask & ~floor_rows[:, None])
        if exact is not None:
            sub_mask, sub_floor = mask[exact.rows], floor_rows[exact.rows]
            values = exact.values
            sparse_mask, floor_mask = sub_mask & ~sub_floor[:, None], sub_mask & sub_floor[:, None]
        else:
            values = bound
            sparse_mask, floor_mask = mask & ~floor_rows[:, None], mask & floor_rows[:, None]
        result.metrics |= self._bins("accept", values, sparse_mask, result)
        if bool(floor_rows.any()):  # logged beside, never mixed into, the controller's input
            result.metrics |= self._bins("noise_floor", values, floor_mask)
        return result

    def _bins(self, name: str, accept, mask, sparse: AcceptanceResult | None = None) -> dict:
        """Mean, p1/p5/p50 per position bin of a (B, T) acceptance over `mask`, all ranks'
        tokens pooled; `sparse` (the sparse policy's acceptance) also takes the per-bin stats
        (the controller's input) and the per-token histogram."""
        values, positions = flatten_completion(accept, mask)
        values, positions = self.ranks.gather_tokens(values, positions)
        stats = bin_acceptance(values, positions, self.bin_tokens)
        if sparse is not None:
            sparse.stats = stats
            sparse.histograms[f"{name}/histogram"] = values.tolist()
        metrics: dict[str, float | list[float]] = {
            f"{name}/mean": float(values.mean()) if len(values) else math.nan
        }
        if sparse is not None:  # counts in 20 bins over [0, 1], for sparrow-report's histogram
            metrics[f"{name}/hist20"] = torch.histc(values.float(), 20, 0.0, 1.0).tolist()
        for s in stats:
            for stat in ("mean", "p1", "p5", "p50"):
                metrics[f"{name}/{stat}/bin{s.bin_index}"] = getattr(s, stat)
            metrics[f"{name}/count/bin{s.bin_index}"] = s.count
        if stats:
            metrics[f"{name}/p5_min"] = min(s.p5 for s in stats)
        return metrics
