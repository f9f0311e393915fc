"""The monitor: how far the sparse rollout policy is from the dense policy the trainer updates,
measured on each step's own tokens. The trainer calls it twice per step:

    monitor = Monitor(cfg.monitor, cfg.schedule.bin_tokens, engine, actor.model, ranks, ...)
    plan = monitor.plan(num_prompts, dense_is_theta)  # before the rollout
    ...  # engine.generate(..., schedules=plan.schedules, logits_rows=plan.logit_rows)
    result = monitor.measure(step, prompt_ids, batch, plan, dense, engine.last_stats)

`plan` chooses the rows that roll out densely (the noise floor) and the rows whose logits the
engine keeps (exact acceptance); `measure` computes the exact acceptance of those rows
(exact_acceptance.py: a dense pass of its own), or takes it from the update's forward
(rl.dense_pass=update: `rollout_logits` hands the exact rows' rollout distributions to that
forward, which measures them before the weights move), and the paper's top-K bound of all
rows, bins both by position over all ranks (acceptance_metrics.py) with the peers' mismatch
metrics (KL, perplexity ratio, extreme token ratios: mismatch.py), and every `speedup_every`
steps times a dense re-rollout of the same prompts (speedup_probe.py). Its per-bin stats are
the controller's input; the estimators and the binning are pure functions in
sparrow/control/acceptance.py.
"""

from collections.abc import Callable

import torch

from sparrow.distributed import Ranks
from sparrow.monitor.acceptance_metrics import AcceptanceMetrics, AcceptanceResult, ExactAcceptance
from sparrow.monitor.config import MonitorConfig
from sparrow.monitor.exact_acceptance import exact_batch_acceptance, measured_logits
from sparrow.monitor.mismatch import mismatch_metrics
from sparrow.monitor.rollout_plan import RolloutPlan, plan_rollout
from sparrow.monitor.same_weights import SameWeightsDense
from sparrow.monitor.speedup_probe import measure_speedup
from sparrow.rl.actor_config import ActorConfig
from sparrow.rl.batch import RolloutBatch
from sparrow.rl.policy_logprobs import RowLogits


class Monitor:
    def __init__(
        self,
        cfg: MonitorConfig,
        bin_tokens: int,
        engine,
        dense_model,
        ranks: Ranks,
        sampling,
        group_size: int,
        actor_cfg: ActorConfig,
        speedup_seed: Callable[[int], int],
    ):
        """`bin_tokens`: the position-bin width, the schedule's (schedule.bin_tokens), so that the
        controller reads bins of its own width; `engine`: the rollout engine (its schedule, its
        replay of rows without kept logits); `dense_model`: the actor's HF model; `sampling`: the
        rollout's SamplingParams, `group_size` samples per prompt (the speedup probe re-rolls out
        with both); `actor_cfg`: the dense log-prob pass's micro-batching, which the exact
        acceptance's dense pass repeats; `speedup_seed(step)`: the speedup probe's sampling seed
        (a stream of the run's seed)."""
        self.cfg = cfg
        self.bin_tokens = bin_tokens
        self.engine = engine
        self.dense_model = dense_model
        self.sampling = sampling
        self.group_size = group_size
        self.actor_cfg = actor_cfg
        self.speedup_seed = speedup_seed
        self.metrics = AcceptanceMetrics(bin_tokens, ranks)

    def plan(self, num_prompts: int, dense_is_theta: bool) -> RolloutPlan:
        """The rows of this step's rollout of `num_prompts` prompts that decode densely and that
        keep their logits, under the engine's current schedule; `dense_is_theta`: the engine's
        dense decode is the dense policy (no adapter merged into its weights)."""
        return plan_rollout(
            self.cfg, num_prompts, self.group_size, self.engine.schedule, dense_is_theta
        )

    def rollout_logits(self, batch: RolloutBatch, plan: RolloutPlan) -> RowLogits | None:
        """Per row of `batch`, the rollout logits (C_b, V) its exact acceptance compares with
        (None off the exact rows), for the update's forward to measure; None when monitor.exact
        is off. Rows the engine kept no logits for are replayed now (under the schedule they
        were rolled out with, before it moves) and stored on the batch, so that a separate pass
        (a skipped update) does not replay them again."""
        if not self.cfg.exact:
            return None
        rows = plan.logit_rows
        assert rows is not None, "monitor.exact plans logit rows"
        sparse = self.engine.schedule
        schedules = [None if f else sparse for f in plan.floor_rows.tolist()]  # as rolled out
        logits = measured_logits(self.engine, batch, torch.tensor(rows), schedules)
        kept = list(batch.rollout_logits or [None] * len(batch))
        batch.rollout_logits = [
            x if x is not None else k for x, k in zip(logits, kept, strict=True)
        ]
        return logits

    def measure(
        self,
        step: int,
        prompt_ids: list[list[int]],
        batch: RolloutBatch,
        plan: RolloutPlan,
        dense,
        rollout_stats,
        exact_values: torch.Tensor | None = None,
    ) -> AcceptanceResult:
        """Step `step`'s (0-based) acceptance of `batch` (rolled out from `prompt_ids` under
        `plan`) against `dense`, the dense policy's log-probs and top-K of it (a LogprobOutput).
        `exact_values` (B, T): the exact rows' acceptance as the update's forward measured it
        (`rollout_logits`); None: measured here, with a dense pass of the actor's model, which
        must then still hold the weights `dense` scored with. Call before the schedule moves:
        rows without kept logits are replayed under it. Adds the measured speedup on its steps
        (`rollout_stats`: the rollout's RolloutStats)."""
        speedup = self._speedup(step, prompt_ids, rollout_stats)
        exact = None
        if self.cfg.exact:
            rows = torch.tensor(plan.logit_rows)  # (B,) bool
            if exact_values is not None:
                values = exact_values[rows]  # (b, T)
            else:
                values = self._exact_pass(batch, plan, rows)
            exact = ExactAcceptance(values, rows)
        result = self.metrics.measure(batch, dense, plan.floor_rows, exact)
        sparse_tokens = batch.completion_mask & ~plan.floor_rows[:, None]  # (B, T)
        result.metrics |= mismatch_metrics(
            batch.sampled_logprobs,
            dense.token_logprobs,
            sparse_tokens,
            self.bin_tokens,
            self.metrics.ranks,
        )
        result.metrics |= speedup
        return result

    def _exact_pass(self, batch: RolloutBatch, plan: RolloutPlan, rows: torch.Tensor):
        """(b, T) the exact acceptance of the `rows` (B,) bool, with a dense pass of its own."""
        sparse = self.engine.schedule
        return exact_batch_acceptance(
            self.engine,
            self.dense_model,
            batch.select(torch.arange(len(batch))[rows]),
            self.sampling.temperature,
            self.actor_cfg.micro_batch_size,
            [None if f else sparse for f in plan.floor_rows[rows].tolist()],
            share_prefix=self.actor_cfg.share_prefix,
        )

    def measure_same_weights(
        self,
        step: int,
        prompt_ids: list[list[int]],
        batch: RolloutBatch,
        plan: RolloutPlan,
        same: SameWeightsDense,
        rollout_stats,
    ) -> AcceptanceResult:
        """`measure` for rows that may be older than the trainer's weights (asynchronous
        rollout): every figure over the monitored rows alone, against `same`, the dense policy
        of the weights that sampled them (same_weights.py), never the trainer's newer one."""
        speedup = self._speedup(step, prompt_ids, rollout_stats)
        sub = batch.select(torch.arange(len(batch))[same.rows])
        floor = plan.floor_rows[same.rows]  # (b,)
        everyone = torch.ones(len(sub), dtype=torch.bool)
        exact = ExactAcceptance(same.exact, everyone) if self.cfg.exact else None
        result = self.metrics.measure(sub, same.dense, floor, exact)
        result.metrics |= mismatch_metrics(
            sub.sampled_logprobs,
            same.dense.token_logprobs,
            sub.completion_mask & ~floor[:, None],
            self.bin_tokens,
            self.metrics.ranks,
        )
        return AcceptanceResult(result.metrics | speedup, result.stats, result.histograms)

    def probes_speedup(self, step: int) -> bool:
        """Whether `measure` of step `step` re-rolls out on the engine (the speedup probe), with
        the weights the step's rows were drawn with: the engine's sleep keeps them until then."""
        every = self.cfg.speedup_every
        return self.engine.schedule is not None and bool(every) and (step + 1) % every == 0

    def _speedup(self, step: int, prompt_ids: list[list[int]], rollout_stats) -> dict:
        if not self.probes_speedup(step):
            return {}
        return measure_speedup(
            self.engine,
            prompt_ids,
            self.sampling,
            self.group_size,
            rollout_stats,
            self.speedup_seed(step),
        )
