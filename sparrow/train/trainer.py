"""The GRPO loop: sparse rollouts -> rewards -> advantages -> dense log-probs -> monitor and
controller -> update -> weight sync -> eval -> checkpoint.

    sparrow-train                       # SmolLM2 on the embedded task (conf/config.yaml)
    sparrow-train preset=smoke          # 2 steps of a tiny model

Departures from the Sparrow paper's recipe (DESIGN.md §1), on purpose:
- the budget schedule is set online by a closed-loop controller from this step's p5 acceptance
  (the paper calibrates an offline table; `schedule.mode=fixed` reproduces that);
- acceptance is exact over the full vocabulary where affordable (`monitor.exact`: the rollout
  logits the engine keeps for a share of the sequences), with the paper's top-K bound beside it; a
  share of prompts can be rolled out densely to log the noise floor (`monitor.noise_floor_fraction`)
  and every few steps a dense rollout is timed for the measured speedup (`monitor.speedup_every`);
- one optimizer update per rollout batch (on-policy up to the sparse/dense mismatch, which TIS
  corrects), as the paper's recipe.
Every data-parallel rank runs its own engine on its share of the step's prompts.
"""

import logging
import os
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as dist

from sparrow.batch import RolloutBatch, collate_rollouts
from sparrow.config import SparrowConfig
from sparrow.control.controller import make_controller
from sparrow.control.cost_model import CostConfig, ModelShape, predicted_speedup
from sparrow.distill.distill_sparse import DistillSparse
from sparrow.models.loading import load_model
from sparrow.rl.actor import DenseActor
from sparrow.rl.advantages import broadcast_to_tokens, make_advantage_fn
from sparrow.rl.losses import METRIC_REDUCTIONS, PolicyLoss
from sparrow.rollout.engine import LLMEngine, SamplingParams
from sparrow.tasks.data import PromptIterator, load_prompts
from sparrow.tasks.rewards import build_reward, score_batch
from sparrow.train.checkpoint import CheckpointManager
from sparrow.train.evaluation import evaluate, paired_difference
from sparrow.train.metrics_logger import MetricsLogger
from sparrow.train.step_monitor import StepMonitor, global_sum
from sparrow.train.step_report import (
    format_eval_line,
    format_plan,
    format_step_line,
    rollout_metrics,
)

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
        self.shape = ModelShape.from_hf_config(loaded.model.config, dtype_bytes=4)
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", cfg.rl.keep_last)
        self.logger = MetricsLogger(cfg.logger, self.run_dir, asdict(cfg), enabled=self.rank == 0)
        self.step_monitor = StepMonitor(cfg, self.engine, self.actor, self.logger, self.world)
        self.monitor = self.step_monitor.monitor  # this step's acceptance, as the controller saw it
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
        sparse = self.engine.schedule  # None in dense mode
        # A gated adapter never acts on dense rows: the engine's dense decode is then theta's.
        dense_is_theta = self.distill is None or self.distill.cfg.gate
        n_floor = self.step_monitor.num_noise_floor_prompts(
            len(prompts), engine_is_dense_policy=sparse is not None and dense_is_theta
        )
        prompt_ids = [p.token_ids for p in prompts]
        keep_logits = self.step_monitor.logit_rows(len(prompts), n_floor)  # exact monitor's rows
        outputs = self.engine.generate(
            prompt_ids,
            replace(self.sampling, return_logits=keep_logits is not None),
            n=cfg.rl.group_size,
            progress=cfg.rollout.progress and self.rank == 0,
            schedules=self.step_monitor.rollout_schedules(len(prompts), n_floor, sparse),
            logits_rows=keep_logits,
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
        speedup = {}
        if sparse is not None:
            speedup = self.step_monitor.measure_speedup(
                self.step, prompt_ids, self.sampling, rollout_stats
            )
        t_probe = time.perf_counter()

        # GRPO groups never span ranks (a rank rolls out whole groups), so advantages are local.
        advantages = self.advantage_fn(scores.scores, batch.group_ids)  # (B,)
        # Both policies at the rollout temperature, so ratios, TIS and acceptance compare alike.
        temperature = cfg.rollout.temperature
        dense = self.actor.compute_logprobs(
            batch.input_ids,
            batch.attention_mask,
            topk=cfg.monitor.top_k,
            temperature=temperature,
            prompt_lens=batch.prompt_lens,
            group_ids=batch.group_ids,
        )
        t_logprobs = time.perf_counter()
        floor_rows = torch.tensor([o.prompt_index >= len(prompts) - n_floor for o in outputs])
        accept_metrics, stats = self.step_monitor.measure(self.step, batch, dense, floor_rows)
        batch.rollout_logits = None  # the monitor's (C_b, V) rows: free them before the update
        for o in outputs:
            o.logits = None
        accept_metrics |= self._control(batch, stats)

        num_tokens = self._global_sum(batch.completion_mask.sum())
        token_advantages = broadcast_to_tokens(advantages, batch.completion_mask)  # (B, T)
        t_monitor = time.perf_counter()
        update = self._policy_update(batch, dense, token_advantages, num_tokens)
        t_update = time.perf_counter()
        if self.distill is not None:  # step 5: the adapter, on the frozen updated theta
            self.distill.load_base(self.actor.gathered_state_dict())
            update |= self.distill.step(
                batch,
                dense.token_logprobs,
                token_advantages,
                temperature,
                num_tokens,
                dense_topk=(dense.topk_ids, dense.topk_logprobs),
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

    # ---- pieces -----------------------------------------------------------------------------

    def _policy_update(self, batch: RolloutBatch, dense, token_advantages, num_tokens) -> dict:
        """One GRPO/TIS update of theta on the batch (ratios against the dense log-probs `dense`
        taken before the update), with its metrics reduced over ranks."""
        cfg = self.cfg
        train_batch = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "completion_mask": batch.completion_mask,
            "old_logprobs": dense.token_logprobs,
            "rollout_logprobs": batch.sampled_logprobs,
            "advantages": token_advantages,
            "prompt_lens": batch.prompt_lens,  # the group structure, for the shared prompt pass
            "group_ids": batch.group_ids,
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

        update = self.actor.train_step(
            self.actor.micro_batches(train_batch),
            loss_fn,
            cfg.rollout.temperature,
        )
        update |= {k: self._global_extreme(v, METRIC_REDUCTIONS[k]) for k, v in extremes.items()}
        self._check_nonfinite(update)
        return update

    def _control(self, batch: RolloutBatch, stats) -> dict:
        """The controller's move from this step's per-bin stats, and the cost model's predicted
        speedup for the schedule the batch was rolled out with."""
        if self.controller is None:
            return {}
        rolled_with = self.controller.schedule
        prompt_tokens = int(batch.prompt_lens.float().mean())
        output_tokens = max(1, int(batch.completion_mask.sum(1).float().mean()))
        cost_cfg = CostConfig(num_dense_layers=len(self.cfg.rollout.engine.dense_layers))
        metrics = {
            "controller/tau": self.cfg.controller.tau,
            "speedup/predicted": predicted_speedup(
                self.shape, prompt_tokens, output_tokens, len(batch), rolled_with, cost_cfg
            ),
        }
        self.controller.update(stats)
        self._push_schedule()
        for i, b in enumerate(self.controller.schedule.budgets_pages):
            metrics[f"schedule/budget_pages/bin{i}"] = b
        return metrics

    def _sync_engine(self) -> None:
        """The rollout policy's weights into the engine: theta; with DistillSparse also phi,
        unmerged and gated to sparse decode steps (distill.gate), or merged into theta."""
        if self.distill is not None and not self.distill.cfg.gate:
            self.engine.update_weights(self.distill.merged_state_dict())
            return
        self.engine.update_weights(self.actor.gathered_state_dict())
        if self.distill is not None:
            self.engine.set_lora(self.distill.lora_factors())

    def _push_schedule(self) -> None:
        # No controller means schedule.mode=dense: the engine attends densely.
        budget = None if self.controller is None else self.controller.schedule.budget_pages
        self.engine.set_schedule(budget)

    def _evaluate(self) -> dict:
        ecfg = self.cfg.rl.eval
        prompts = self.eval_data.prompts[: ecfg.num_prompts][self.rank :: self.world]
        params = SamplingParams(temperature=ecfg.temperature, max_tokens=ecfg.max_new_tokens)
        # The dense policy is what is trained and scored: evaluate without sparsity (and, with
        # DistillSparse, without the adapter: a gated one is off at dense steps by itself).
        self.engine.set_schedule(None)
        merged = self.distill is not None and not self.distill.cfg.gate
        if merged:
            self.engine.update_weights(self.actor.gathered_state_dict())
        result, correct = evaluate(self.engine, self.reward, prompts, params, self._global_sum)
        if merged:
            self._sync_engine()
        self._push_schedule()
        result |= self._paired_delta(correct)
        if self.rank == 0:
            print(format_eval_line(self.step, result), flush=True)
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
        return global_sum(value, self.world)

    def _global_mean(self, total, count) -> float:
        return self._global_sum(total) / max(self._global_sum(count), 1.0)

    def _global_extreme(self, values: list[float], how: str) -> float:
        t = torch.tensor([min(values) if how == "min" else max(values)], dtype=torch.float64)
        if self.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MIN if how == "min" else dist.ReduceOp.MAX)
        return float(t)

    def plan(self) -> str:
        return format_plan(self.cfg, self.train_data.summary(), self.world, self.actor.model.config)
