"""What one GRPO step measures about its rollout: per-bin acceptance of the sparse policy (exact
where affordable, the paper's top-K bound beside it), the dense-vs-dense noise floor of a densely
rolled-out share of prompts, the KV-read ratio, and every few steps a timed dense re-rollout for
the measured speedup. The trainer hands the per-bin stats to the controller.

Data-parallel ranks pool their tokens before percentiles (`gather_tokens`, `global_sum`).
"""

import math

import torch
import torch.distributed as dist
from torch import Tensor

from sparrow.config import SparrowConfig
from sparrow.control.acceptance import (
    AcceptanceMonitor,
    BinStats,
    bin_acceptance,
    flatten_completion,
    topk_acceptance_bound,
)
from sparrow.rl.batch import RolloutBatch
from sparrow.train.exact_acceptance import exact_batch_acceptance


def global_sum(value, world: int) -> float:
    t = torch.as_tensor(value, dtype=torch.float64).reshape(1).clone()
    if world > 1:
        dist.all_reduce(t)
    return float(t)


def gather_tokens(values: Tensor, positions: Tensor, world: int) -> tuple[Tensor, Tensor]:
    if world == 1:
        return values, positions
    parts = [None] * world
    dist.all_gather_object(parts, (values.cpu(), positions.cpu()))
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


class StepMonitor:
    def __init__(self, cfg: SparrowConfig, engine, actor, logger, world: int):
        self.cfg = cfg
        self.engine = engine
        self.actor = actor
        self.logger = logger
        self.world = world
        self.monitor = AcceptanceMonitor(cfg.monitor.bin_tokens)

    # ---- noise floor and measured speedup ---------------------------------------------------

    def num_noise_floor_prompts(self, num_prompts: int, engine_is_dense_policy: bool) -> int:
        """Prompts of this rank rolled out densely to measure the dense-vs-dense noise floor
        (the last ones of its share; at least one when the fraction is positive). None when the
        engine's dense decode is not the dense policy (DistillSparse's adapter is loaded)."""
        fraction = self.cfg.monitor.noise_floor_fraction
        if fraction <= 0 or not engine_is_dense_policy:
            return 0
        return min(num_prompts - 1, max(1, round(fraction * num_prompts)))

    def rollout_schedules(self, num_prompts: int, n_floor: int, sparse) -> list | None:
        """Per-sequence schedules for generate: `sparse` except for the noise-floor prompts."""
        if not n_floor:
            return None  # the engine's schedule for all
        group = self.cfg.rl.group_size
        return [
            sparse if i < num_prompts - n_floor else None
            for i in range(num_prompts)
            for _ in range(group)
        ]

    def measure_speedup(self, step: int, prompts: list[list[int]], sampling, sparse_stats) -> dict:
        """Every `monitor.speedup_every` steps: the same prompts rolled out densely, timed, so
        the dashboard shows the measured decode speedup beside the cost model's prediction."""
        every = self.cfg.monitor.speedup_every
        if not every or (step + 1) % every:
            return {}
        schedule = self.engine.schedule
        self.engine.set_schedule(None)
        self.engine.generate(prompts, sampling, self.cfg.rl.group_size)
        self.engine.set_schedule(schedule)
        dense_stats = self.engine.last_stats
        return {
            "speedup/measured": sparse_stats.decode_tok_s / max(dense_stats.decode_tok_s, 1e-9),
            "speedup/dense_decode_tok_s": dense_stats.decode_tok_s,
            "speedup/sparse_decode_tok_s": sparse_stats.decode_tok_s,
        }

    # ---- acceptance -------------------------------------------------------------------------

    def exact_rows(self, floor_rows: Tensor) -> Tensor:
        """(B,) bool, the rows the exact acceptance measures: every k-th sequence (all groups
        alike; k from `monitor.exact_fraction`) and every noise-floor one (`floor_rows`)."""
        stride = max(1, round(1 / self.cfg.monitor.exact_fraction))
        return (torch.arange(len(floor_rows)) % stride == 0) | floor_rows

    def logit_rows(self, num_prompts: int, n_floor: int) -> list[bool] | None:
        """Which sequences of the rollout (prompt-major, `rl.group_size` each, the last `n_floor`
        prompts dense) keep their logits for `measure`, which then replays none of them; None
        when `monitor.exact` is off."""
        if not self.cfg.monitor.exact:
            return None
        group = self.cfg.rl.group_size
        floor = [i >= num_prompts - n_floor for i in range(num_prompts) for _ in range(group)]
        return self.exact_rows(torch.tensor(floor)).tolist()

    def measure(
        self, step: int, batch: RolloutBatch, dense, floor_rows: Tensor
    ) -> tuple[dict, list[BinStats]]:
        """Metrics of the step's acceptance, and the per-bin stats the controller reads.

        The controller reads the exact full-vocabulary acceptance when `monitor.exact` is on
        (from the rollout logits the batch carries for the `exact_rows`, else from a second,
        teacher-forced decode pass under the schedule the batch was rolled out with: call
        before the schedule changes), else the paper's top-K bound; the bound is
        always logged beside it (`accept_topk/...`). Rows rolled out densely (`floor_rows`,
        (B,) bool) measure the noise floor (`noise_floor/...`) and are kept out of the stats.
        """
        mask = batch.completion_mask
        sparse_mask = mask & ~floor_rows[:, None]  # (B, T)
        bound = torch.zeros(mask.shape)  # (B, T)
        bound[mask] = topk_acceptance_bound(
            batch.topk_ids[mask],
            batch.topk_logprobs[mask],
            dense.topk_ids[mask],
            dense.topk_logprobs[mask],
        )
        self.monitor.reset()
        metrics = self._bin_metrics(step, "accept_topk", bound, sparse_mask)
        if self.cfg.monitor.exact:
            rows = torch.arange(len(batch))
            keep = self.exact_rows(floor_rows)  # (B,) bool
            sub = batch.select(rows[keep])
            sub_floor = floor_rows[keep]
            sparse = self.engine.schedule
            exact = exact_batch_acceptance(
                self.engine,
                self.actor.model,
                sub,
                self.cfg.rollout.temperature,
                self.cfg.deepspeed.micro_batch_size,
                [None if f else sparse for f in sub_floor.tolist()],
            )
            sub_mask = sub.completion_mask
            metrics |= self._bin_metrics(
                step, "accept", exact, sub_mask & ~sub_floor[:, None], feed="sparse"
            )
            floor_values, floor_mask = exact, sub_mask & sub_floor[:, None]
        else:
            metrics |= self._bin_metrics(step, "accept", bound, sparse_mask, feed="sparse")
            floor_values, floor_mask = bound, mask & floor_rows[:, None]
        if bool(floor_rows.any()):
            metrics |= self._bin_metrics(
                step, "noise_floor", floor_values, floor_mask, feed="floor"
            )
        metrics |= self._kv_read_metrics(batch)
        return metrics, self.monitor.summary()

    def _bin_metrics(self, step: int, name: str, accept, mask, feed: str | None = None) -> dict:
        """Mean, p1/p5/p50 per position bin of a (B, T) acceptance over completion tokens;
        `feed` "sparse" or "floor" also hands the tokens to the monitor's matching slot."""
        values, positions = flatten_completion(accept, mask)
        values, positions = gather_tokens(values, positions, self.world)
        if feed == "sparse":
            self.monitor.update(values, positions)
            stats = self.monitor.summary()
            self.logger.log_histogram(step + 1, f"{name}/histogram", values.tolist())
        elif feed == "floor":
            self.monitor.update_noise_floor(values, positions)
            stats = self.monitor.noise_floor_summary()
        else:
            stats = bin_acceptance(values, positions, self.cfg.monitor.bin_tokens)
        metrics = {f"{name}/mean": float(values.mean()) if len(values) else math.nan}
        if feed == "sparse":  # counts in 20 bins over [0, 1], for sparrow-report's histogram
            metrics[f"{name}/hist20"] = torch.histc(values.float(), 20, 0.0, 1.0).tolist()
        for s in stats:
            for stat in ("mean", "p1", "p5", "p50"):
                metrics[f"{name}/{stat}/bin{s.bin_index}"] = getattr(s, stat)
            metrics[f"{name}/count/bin{s.bin_index}"] = s.count
        if stats:
            metrics[f"{name}/p5_min"] = min(s.p5 for s in stats)
        return metrics

    def _kv_read_metrics(self, batch: RolloutBatch) -> dict:
        """Pages read by sparse layers over the pages a dense decode would read."""
        mask = batch.completion_mask
        positions = torch.arange(batch.input_ids.shape[1]).expand_as(mask)  # (B, T)
        page = self.cfg.rollout.engine.page_size
        dense_pages = torch.div(positions + page - 1, page, rounding_mode="floor")  # ceil(t / P)
        read = global_sum(batch.budget_pages[mask].sum(), self.world)
        full = global_sum(dense_pages[mask].sum(), self.world)
        return {"kv_read_ratio": read / max(full, 1.0)}
