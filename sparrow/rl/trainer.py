"""The GRPO loop: sparse rollouts -> rewards -> advantages -> dense log-probs -> monitor and
controller -> update -> weight sync -> eval -> checkpoint.

    sparrow-train                       # SmolLM2 on the embedded task (conf/config.yaml)
    sparrow-train preset=smoke          # 2 steps of a tiny model

Departures from the Sparrow paper's recipe (DESIGN.md §1), on purpose:
- the budget schedule is set online by a closed-loop controller from this step's p5 acceptance
  (the paper calibrates an offline table; `schedule.mode=fixed` reproduces that);
- acceptance is exact over the full vocabulary where affordable (`monitor.exact`: a teacher-forced
  replay of a share of the sequences), with the paper's top-K lower bound logged beside it; a
  share of prompts can be rolled out densely to log the noise floor (`monitor.noise_floor_fraction`)
  and every few steps a dense rollout is timed for the measured speedup (`monitor.speedup_every`);
- one optimizer update per rollout batch (on-policy up to the sparse/dense mismatch, which TIS
  corrects), as the paper's recipe.
Every data-parallel rank runs its own engine on its share of the step's prompts.
"""

import logging
import math
import os
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as dist

from sparrow.acceptance import (
    AcceptanceMonitor,
    bin_acceptance,
    flatten_completion,
    topk_acceptance_bound,
)
from sparrow.batch import RolloutBatch, collate_rollouts
from sparrow.config import SparrowConfig
from sparrow.controller import make_controller
from sparrow.cost_model import CostConfig, ModelShape, predicted_speedup
from sparrow.distill.distill_sparse import DistillSparse
from sparrow.models import load_model
from sparrow.rl.actor import DenseActor, split_micro_batches
from sparrow.rl.advantages import broadcast_to_tokens, make_advantage_fn
from sparrow.rl.checkpoint import CheckpointManager
from sparrow.rl.data import PromptIterator, load_prompts
from sparrow.rl.evaluation import evaluate, paired_difference
from sparrow.rl.exact_acceptance import exact_batch_acceptance
from sparrow.rl.losses import METRIC_REDUCTIONS, PolicyLoss
from sparrow.rl.metrics_logger import MetricsLogger
from sparrow.rl.rewards import build_reward, score_batch
from sparrow.rl.step_report import format_step_line, rollout_metrics
from sparrow.rollout.engine import LLMEngine, SamplingParams

log = logging.getLogger(__name__)


class NonFiniteStreak(RuntimeError):
    """Too many consecutive updates skipped for NaN/Inf: stop instead of training on garbage."""


class GRPOTrainer:
    def __init__(self, cfg: SparrowConfig):
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        loaded = load_model(cfg.model)
        self.tokenizer = loaded.tokenizer
        # Data first, so bad input fails in seconds rather than after DeepSpeed starts. Prompts
        # the engine could not hold with a full completion are skipped and counted.
        eng = cfg.rollout.engine
        room = min(
            getattr(loaded.model.config, "max_position_embeddings", None) or 1 << 30,
            eng.num_pages * eng.page_size,
        ) - max(cfg.rollout.max_new_tokens, cfg.rl.eval.max_new_tokens)
        self.train_data = load_prompts(cfg.data, self.tokenizer, context_tokens=room)
        eval_cfg = cfg.rl.eval
        self.eval_data = load_prompts(
            replace(cfg.data, split=eval_cfg.split), self.tokenizer, context_tokens=room
        )
        if torch.cuda.is_available():  # engine, DistillSparse and actor all live on this rank's GPU
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
            loaded.model.to(device)
        # The engine copies the weights it needs (synced from the actor after every update).
        self.engine = LLMEngine(loaded.model, self.tokenizer, cfg.rollout.engine)
        # DistillSparse copies the base weights before ZeRO-3 can partition them in place.
        self.distill = (
            DistillSparse(cfg.distill, loaded.model, self.engine.runner.kv.cfg, cfg.deepspeed.lr)
            if cfg.distill.enabled and cfg.schedule.mode != "dense"
            else None
        )
        self.actor = DenseActor(loaded.model, cfg.deepspeed)
        self.rank, self.world = self.actor.rank, self.actor.world_size
        self.run_dir = Path(cfg.run_dir)

        if cfg.rl.prompts_per_step % self.world:
            raise ValueError(
                f"rl.prompts_per_step={cfg.rl.prompts_per_step} must divide over {self.world} ranks"
            )
        self.prompts = PromptIterator(
            self.train_data, cfg.rl.prompts_per_step, cfg.data.shuffle_seed
        )

        self.controller = make_controller(cfg.schedule, cfg.controller)
        self._push_schedule()
        self.sampling = SamplingParams(
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k,
            max_tokens=cfg.rollout.max_new_tokens,
            ignore_eos=cfg.rollout.ignore_eos,
        )
        self.reward = build_reward(cfg.rl.reward)
        self.advantage_fn = make_advantage_fn(cfg.rl.advantage)
        self.loss_fn = PolicyLoss(cfg.rl.loss)
        self.monitor = AcceptanceMonitor(cfg.monitor.bin_tokens)
        self.shape = ModelShape.from_hf_config(loaded.model.config, dtype_bytes=4)
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", cfg.rl.keep_last)
        self.logger = MetricsLogger(cfg.logger, self.run_dir, asdict(cfg), enabled=self.rank == 0)
        self.step = 0
        self.nonfinite_streak = 0
        self._first_eval: list[float] | None = None  # per-prompt scores at the first evaluation

    # ---- the loop ---------------------------------------------------------------------------

    def fit(self) -> dict:
        self._maybe_resume()
        if self.rank == 0:
            print(self.plan(), flush=True)
        last_eval = None
        if self.cfg.rl.eval.every and self.step == 0:
            last_eval = self._evaluate()
            self.logger.log(0, last_eval)
        while self.step < self.cfg.rl.steps:
            metrics = self.train_step()
            self.step += 1
            if self.cfg.rl.eval.every and (
                self.step % self.cfg.rl.eval.every == 0 or self.step == self.cfg.rl.steps
            ):
                last_eval = self._evaluate()
                metrics |= last_eval
            self.logger.log(self.step, metrics)
            if self.rank == 0 and self.step % self.cfg.logger.console_every == 0:
                print(format_step_line(self.step, self.cfg.rl.steps, metrics), flush=True)
            every = self.cfg.rl.save_every
            if (every and self.step % every == 0) or self.step == self.cfg.rl.steps:
                self.save()
        self.actor.export_hf(self.run_dir / "policy", self.tokenizer)
        self.logger.close()
        return last_eval or {}

    def train_step(self) -> dict:
        cfg = self.cfg
        t0 = time.perf_counter()
        prompts = next(self.prompts)[self.rank :: self.world]  # this rank's share
        n_floor = self._num_noise_floor_prompts(len(prompts))
        outputs = self.engine.generate(
            [p.token_ids for p in prompts],
            self.sampling,
            n=cfg.rl.group_size,
            progress=cfg.rollout.progress and self.rank == 0,
            schedules=self._rollout_schedules(len(prompts), n_floor),
        )
        rollout_stats = self.engine.last_stats
        group_offset = self.rank * len(prompts)
        batch = collate_rollouts(
            [p.token_ids for p in prompts],
            outputs,
            self.tokenizer.pad_token_id,
            [group_offset + o.prompt_index for o in outputs],
        )
        scores = score_batch(
            self.reward,
            [prompts[o.prompt_index].text for o in outputs],
            [o.text for o in outputs],
            [prompts[o.prompt_index].answer for o in outputs],
        )
        t_rollout = time.perf_counter()
        speedup = self._measure_speedup(prompts, rollout_stats)
        t_probe = time.perf_counter()

        # GRPO groups never span ranks (a rank rolls out whole groups), so advantages are local.
        advantages = self.advantage_fn(scores.scores, batch.group_ids)  # (B,)
        # Both policies at the rollout temperature, so ratios, TIS and acceptance compare alike.
        temperature = cfg.rollout.temperature
        dense = self.actor.compute_logprobs(
            batch.input_ids, batch.attention_mask, topk=cfg.monitor.top_k, temperature=temperature
        )
        t_logprobs = time.perf_counter()
        floor_rows = torch.tensor([o.prompt_index >= len(prompts) - n_floor for o in outputs])
        accept_metrics = self._monitor_and_control(batch, dense, floor_rows)

        num_tokens = self._global_sum(batch.completion_mask.sum())
        train_batch = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "completion_mask": batch.completion_mask,
            "old_logprobs": dense.token_logprobs,
            "rollout_logprobs": batch.sampled_logprobs,
            "advantages": broadcast_to_tokens(advantages, batch.completion_mask),
        }

        extremes: dict[str, list[float]] = {}  # min/max metrics: the actor only sums

        def loss_fn(logprobs, mb):
            loss, metrics = self.loss_fn(
                logprobs,
                mb["old_logprobs"],
                mb["rollout_logprobs"],
                mb["advantages"],
                mb["completion_mask"],
                num_tokens,
            )
            for key in [k for k in metrics if METRIC_REDUCTIONS.get(k) in ("min", "max")]:
                extremes.setdefault(key, []).append(float(metrics.pop(key)))
            return loss, metrics

        t_monitor = time.perf_counter()
        update = self.actor.train_step(
            split_micro_batches(train_batch, cfg.deepspeed.micro_batch_size), loss_fn, temperature
        )
        update |= {k: self._global_extreme(v, METRIC_REDUCTIONS[k]) for k, v in extremes.items()}
        self._check_nonfinite(update)
        t_update = time.perf_counter()
        if self.distill is not None:  # step 5: the adapter, on the frozen updated theta
            self.distill.load_base(self.actor.gathered_state_dict())
            update |= self.distill.step(
                batch, dense.token_logprobs, train_batch["advantages"], temperature, num_tokens
            )
        t_distill = time.perf_counter()
        self._sync_engine()
        t_sync = time.perf_counter()

        metrics = rollout_metrics(batch, scores, outputs, self._global_mean)
        metrics |= accept_metrics | speedup
        metrics |= {
            k
            if k.startswith("distill/")
            else f"loss/{k}"
            if k in ("loss", "pg_loss")
            else f"update/{k}": v
            for k, v in update.items()
        }
        metrics |= scores.stats.as_metrics()
        metrics |= {
            "time/rollout_s": t_rollout - t0,
            "time/logprobs_s": t_logprobs - t_probe,
            "time/monitor_s": t_monitor - t_logprobs + t_probe - t_rollout,
            "time/update_s": t_update - t_monitor,
            "time/distill_s": t_distill - t_update,
            "time/sync_s": t_sync - t_distill,
            "time/step_s": t_sync - t0,
        }
        return metrics

    # ---- noise floor and measured speedup ---------------------------------------------------

    def _num_noise_floor_prompts(self, num_prompts: int) -> int:
        """Prompts of this rank rolled out densely to measure the dense-vs-dense noise floor
        (the last ones of its share; at least one when the fraction is positive)."""
        fraction = self.cfg.monitor.noise_floor_fraction
        if self.controller is None or fraction <= 0:
            return 0  # dense mode: every sequence already measures the floor
        if self.distill is not None:
            return 0  # the engine holds theta + phi: a dense rollout would not be the dense policy
        return min(num_prompts - 1, max(1, round(fraction * num_prompts)))

    def _rollout_schedules(self, num_prompts: int, n_floor: int) -> list | None:
        if not n_floor:
            return None  # the engine's schedule for all
        sparse = self.controller.schedule.budget_pages
        group = self.cfg.rl.group_size
        return [
            sparse if i < num_prompts - n_floor else None
            for i in range(num_prompts)
            for _ in range(group)
        ]

    def _measure_speedup(self, prompts, sparse_stats) -> dict:
        """Every `monitor.speedup_every` steps: the same prompts rolled out densely, timed, so
        the dashboard shows the measured decode speedup beside the cost model's prediction."""
        every = self.cfg.monitor.speedup_every
        if not every or self.controller is None or (self.step + 1) % every:
            return {}
        self.engine.set_schedule(None)
        self.engine.generate([p.token_ids for p in prompts], self.sampling, self.cfg.rl.group_size)
        self._push_schedule()
        dense_stats = self.engine.last_stats
        return {
            "speedup/measured": sparse_stats.decode_tok_s / max(dense_stats.decode_tok_s, 1e-9),
            "speedup/dense_decode_tok_s": dense_stats.decode_tok_s,
            "speedup/sparse_decode_tok_s": sparse_stats.decode_tok_s,
        }

    # ---- pieces -----------------------------------------------------------------------------

    def _monitor_and_control(self, batch: RolloutBatch, dense, floor_rows) -> dict:
        """Per-token acceptance pooled over ranks, per-bin stats, then the controller.

        The controller reads the exact full-vocabulary acceptance when `monitor.exact` is on
        (a second, teacher-forced decode pass), else the paper's top-K bound; the bound is
        always logged beside it (`accept_topk/...`). Rows rolled out densely (`floor_rows`, (B,)
        bool) measure the dense-vs-dense noise floor (`noise_floor/...`) and are kept out of
        what the controller sees.
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
        metrics = self._bin_metrics("accept_topk", bound, sparse_mask)
        if self.cfg.monitor.exact:
            # Every k-th sparse sequence (all groups alike) and every noise-floor one: the replay
            # costs about one more rollout of those rows.
            stride = max(1, round(1 / self.cfg.monitor.exact_fraction))
            rows = torch.arange(len(batch))
            keep = (rows % stride == 0) & ~floor_rows | floor_rows
            sub = batch.select(rows[keep])
            sub_floor = floor_rows[keep]
            sparse_schedule = None if self.controller is None else self.controller.schedule
            schedules = [
                None if f or sparse_schedule is None else sparse_schedule.budget_pages
                for f in sub_floor.tolist()
            ]
            exact = exact_batch_acceptance(
                self.engine,
                self.actor.model,
                sub,
                self.cfg.rollout.temperature,
                self.cfg.deepspeed.micro_batch_size,
                schedules,
            )
            sub_mask = sub.completion_mask
            metrics |= self._bin_metrics(
                "accept", exact, sub_mask & ~sub_floor[:, None], feed="sparse"
            )
            floor_values, floor_mask = exact, sub_mask & sub_floor[:, None]
        else:
            metrics |= self._bin_metrics("accept", bound, sparse_mask, feed="sparse")
            floor_values, floor_mask = bound, mask & floor_rows[:, None]
        if bool(floor_rows.any()):
            metrics |= self._bin_metrics("noise_floor", floor_values, floor_mask, feed="floor")
        stats = self.monitor.summary()

        metrics |= self._kv_read_metrics(batch)
        if self.controller is not None:
            metrics["controller/tau"] = self.cfg.controller.tau
            rolled_with = self.controller.schedule  # what this batch was generated under
            prompt_tokens = int(batch.prompt_lens.float().mean())
            output_tokens = max(1, int(batch.completion_mask.sum(1).float().mean()))
            cost_cfg = CostConfig(num_dense_layers=len(self.cfg.rollout.engine.dense_layers))
            metrics["speedup/predicted"] = predicted_speedup(
                self.shape, prompt_tokens, output_tokens, len(batch), rolled_with, cost_cfg
            )
            self.controller.update(stats)
            self._push_schedule()
            for i, b in enumerate(self.controller.schedule.budgets_pages):
                metrics[f"schedule/budget_pages/bin{i}"] = b
        return metrics

    def _bin_metrics(self, name: str, accept, mask, feed: str | None = None) -> dict:
        """Mean, p1/p5/p50 per position bin of a (B, T) acceptance over completion tokens;
        `feed` "sparse" or "floor" also hands the tokens to the monitor's matching slot."""
        values, positions = flatten_completion(accept, mask)
        values, positions = self._gather_tokens(values, positions)
        if feed == "sparse":
            self.monitor.update(values, positions)
            stats = self.monitor.summary()
            self.logger.log_histogram(self.step + 1, f"{name}/histogram", values.tolist())
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
        read = self._global_sum(batch.budget_pages[mask].sum())
        full = self._global_sum(dense_pages[mask].sum())
        return {"kv_read_ratio": read / max(full, 1.0)}

    def _sync_engine(self) -> None:
        """The rollout policy's weights into the engine: theta, or theta + phi merged."""
        if self.distill is None:
            self.engine.update_weights(self.actor.gathered_state_dict())
        else:
            self.engine.update_weights(self.distill.merged_state_dict())

    def _push_schedule(self) -> None:
        # No controller means schedule.mode=dense: the engine attends densely.
        budget = None if self.controller is None else self.controller.schedule.budget_pages
        self.engine.set_schedule(budget)

    def _evaluate(self) -> dict:
        ecfg = self.cfg.rl.eval
        prompts = self.eval_data.prompts[: ecfg.num_prompts][self.rank :: self.world]
        params = SamplingParams(temperature=ecfg.temperature, max_tokens=ecfg.max_new_tokens)
        # The dense policy is what is trained and scored: evaluate without sparsity (and, with
        # DistillSparse, without the adapter).
        self.engine.set_schedule(None)
        if self.distill is not None:
            self.engine.update_weights(self.actor.gathered_state_dict())
        result, correct = evaluate(self.engine, self.reward, prompts, params, self._global_sum)
        self._sync_engine()
        self._push_schedule()
        result |= self._paired_delta(correct)
        if self.rank == 0:
            print(
                f"eval step {self.step}: accuracy {result['eval/accuracy']:.3f} "
                f"(95% CI {result['eval/accuracy_lo95']:.3f}-{result['eval/accuracy_hi95']:.3f}, "
                f"n={int(result['eval/n'])}), mean length {result['eval/len_mean']:.1f}"
                + (
                    f"; vs first eval {result['eval/delta']:+.3f} "
                    f"(95% CI {result['eval/delta_lo95']:+.3f} to {result['eval/delta_hi95']:+.3f})"
                    if "eval/delta" in result
                    else ""
                ),
                flush=True,
            )
        return result

    def _paired_delta(self, correct: list[float]) -> dict:
        """Accuracy now minus at the first evaluation, on the same prompts, with a paired 95% CI.

        Rank-local prompts (one rank's share); with several ranks it is that rank's estimate.
        """
        if self._first_eval is None:
            self._first_eval = correct
            return {}
        return paired_difference(correct, self._first_eval)

    def _check_nonfinite(self, update: dict) -> None:
        if update.get("skipped", 0.0) > 0:
            self.nonfinite_streak += 1
            log.warning("step %d: non-finite loss or gradient, update skipped", self.step + 1)
            if self.nonfinite_streak >= self.cfg.rl.max_nonfinite_streak:
                raise NonFiniteStreak(
                    f"{self.nonfinite_streak} consecutive updates had a non-finite loss or "
                    f"gradient (last at step {self.step + 1}); stopping. Lower deepspeed.lr or "
                    "check the data; resume=auto restarts from the last checkpoint."
                )
        else:
            self.nonfinite_streak = 0

    # ---- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "prompts": self.prompts.state_dict(),
            "controller": None if self.controller is None else self.controller.state_dict(),
            "engine_generate_calls": self.engine.num_generate_calls,
            "nonfinite_streak": self.nonfinite_streak,
            "first_eval": self._first_eval,
            "distill": None if self.distill is None else self.distill.state_dict(),
        }

    def save(self) -> Path:
        return self.checkpoints.save(self.step, self.state_dict(), self.actor.save_checkpoint)

    def _maybe_resume(self) -> None:
        resume = self.cfg.resume
        if resume == "never":
            return
        path = self.checkpoints.latest_complete() if resume == "auto" else Path(resume)
        if path is None:
            return
        loaded = self.checkpoints.load(path)
        self.actor.load_checkpoint(loaded.actor_dir)
        state = loaded.state
        self.prompts.load_state_dict(state["prompts"])
        if self.controller is not None and state["controller"] is not None:
            self.controller.load_state_dict(state["controller"])
        self.engine.num_generate_calls = state["engine_generate_calls"]
        self.nonfinite_streak = state["nonfinite_streak"]
        self._first_eval = state.get("first_eval")
        self.step = loaded.step
        if self.distill is not None:
            if state.get("distill") is not None:
                self.distill.load_state_dict(state["distill"])
            self.distill.load_base(self.actor.gathered_state_dict())
        self._sync_engine()
        self._push_schedule()
        if self.rank == 0:
            print(f"resumed from {path} at step {self.step}", flush=True)

    # ---- reductions over ranks --------------------------------------------------------------

    def _global_sum(self, value) -> float:
        t = torch.as_tensor(value, dtype=torch.float64).reshape(1).clone()
        if self.world > 1:
            dist.all_reduce(t)
        return float(t)

    def _global_mean(self, total, count) -> float:
        return self._global_sum(total) / max(self._global_sum(count), 1.0)

    def _global_extreme(self, values: list[float], how: str) -> float:
        t = torch.tensor([min(values) if how == "min" else max(values)], dtype=torch.float64)
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MIN if how == "min" else dist.ReduceOp.MAX)
        return float(t)

    def _gather_tokens(self, values: torch.Tensor, positions: torch.Tensor):
        if self.world == 1:
            return values, positions
        parts = [None] * self.world
        dist.all_gather_object(parts, (values.cpu(), positions.cpu()))
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    def plan(self) -> str:
        cfg = self.cfg
        sched = (
            "dense"
            if cfg.schedule.mode == "dense"
            else (
                f"{cfg.schedule.mode} (tau {cfg.controller.tau}, bins of {cfg.schedule.bin_tokens})"
            )
        )
        return (
            f"sparrow-train: {cfg.model.name} | {self.train_data.summary()}\n"
            f"  {cfg.rl.steps} steps x {cfg.rl.prompts_per_step} prompts x {cfg.rl.group_size} "
            f"samples, {cfg.rollout.max_new_tokens} new tokens max, ranks {self.world}, "
            f"ZeRO-{cfg.deepspeed.zero_stage}; schedule {sched}; run dir {self.run_dir}"
        )
