"""The GRPO loop. One step, in `train_step`: sparse rollout (as the monitor planned it) -> rewards
(with dynamic sampling, rounds of both until the step holds its groups with signal) -> advantages
-> dense log-probs -> the monitor's acceptance -> controller update -> policy update ->
DistillSparse update -> weight sync -> logging; `fit` adds evaluation and checkpoints around the
steps.

    sparrow-train                       # SmolLM2 on the embedded task (conf/config.yaml)
    sparrow-train preset=smoke          # 2 steps of a tiny model

Departures from the Sparrow paper's recipe (docs/DESIGN.md), on purpose:
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
import signal
from dataclasses import asdict, replace
from pathlib import Path

import torch

from sparrow.distill.distill_sparse import DistillSparse
from sparrow.distributed import Ranks
from sparrow.models.loading import load_model
from sparrow.models.shape import ModelShape
from sparrow.monitor.acceptance_metrics import AcceptanceResult
from sparrow.monitor.monitor import Monitor
from sparrow.monitor.rollout_plan import RolloutPlan
from sparrow.rl.advantages import broadcast_to_tokens, make_advantage_fn
from sparrow.rl.batch import RolloutBatch, collate_rollouts
from sparrow.rl.losses import PolicyLoss
from sparrow.rl.overlong import overlong_penalty, truncated_rows
from sparrow.rl.policy_logprobs import LogprobOutput
from sparrow.rl.reference import ReferencePolicy
from sparrow.rollout.engine import LLMEngine, SamplingParams
from sparrow.tasks.data import PromptIterator
from sparrow.tasks.rewards import BatchScores, build_reward, score_batch
from sparrow.train.config import SparrowConfig
from sparrow.train.dynamic_sampling import Rollout, Round, Sampled, sample_step
from sparrow.train.evaluation import PairedBaseline, evaluate
from sparrow.train.logs.metrics_logger import MetricsLogger
from sparrow.train.logs.progress import StepClock
from sparrow.train.memory.run_inputs import load_run_inputs
from sparrow.train.phase_timer import PhaseTimer
from sparrow.train.policy_update import PolicyUpdate
from sparrow.train.run.checkpoint import CheckpointManager
from sparrow.train.run.policy_export import export_policy
from sparrow.train.run.seeds import resolve_seeds, seed_global_rngs
from sparrow.train.run.state import CheckpointedRun
from sparrow.train.run.stop_in_loop import GracefulStop, StopRequested
from sparrow.train.run.stop_outside_loop import STARTUP_ADVICE, stop_at_once
from sparrow.train.run.weight_guard import check_weights, next_nonfinite_streak
from sparrow.train.schedule_steering import ScheduleSteering
from sparrow.train.step_report import (
    RewardFailures,
    format_eval_line,
    format_plan,
    format_step_line,
    rollout_metrics,
    throughput_metrics,
    update_metrics,
)

log = logging.getLogger(__name__)


class GRPOTrainer(CheckpointedRun):
    def __init__(self, cfg: SparrowConfig, make_actor=None, pinned: frozenset[str] = frozenset()):
        """`make_actor(model, cfg.actor)`: the dense policy's trainer, by default DenseActor
        (DeepSpeed, imported only then); tests pass a plain-torch one with the same interface.
        `pinned`: config keys the user set explicitly, which the memory fit leaves as set."""
        if make_actor is None:
            from sparrow.rl.actor import DenseActor

            make_actor = DenseActor
        self.cfg = cfg
        eng = cfg.rollout.engine
        # Every random stream from the one `seed` (run_seeds.py). Each rank samples its own
        # stream: with one seed everywhere, row i of every rank would draw the same random numbers
        # (the launcher's RANK: the process group is not up yet).
        self.seeds = resolve_seeds(
            cfg.seed,
            eng.seed,
            cfg.data.shuffle,
            cfg.data.shuffle_seed,
            int(os.environ.get("RANK", "0")),
        )
        seed_global_rngs(self.seeds.global_rngs)
        loaded = load_model(cfg.model)
        self.tokenizer = loaded.tokenizer
        shape = ModelShape.from_hf_config(loaded.model.config)
        on_gpu = torch.cuda.is_available()
        # Prompts first, then the memory plan they size (run_inputs.py).
        self.train_data, self.eval_data, self.memory = load_run_inputs(
            cfg, self.tokenizer, loaded.model.config, shape, on_gpu, pinned
        )
        cfg = self.cfg = self.memory.cfg
        if on_gpu:  # engine, DistillSparse and actor all live on this rank's GPU
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
            loaded.model.to(device)
        # The engine copies the weights it needs (synced from the actor after every update).
        engine_cfg = replace(eng, seed=self.seeds.sampling)
        self.engine = LLMEngine(loaded.model, self.tokenizer, engine_cfg)
        # DistillSparse copies the base weights before ZeRO-3 can partition them in place.
        self.distill = (
            DistillSparse(
                cfg.distill,
                loaded.model,
                self.engine.runner.kv.cfg,
                cfg.actor.lr,
                init_seed=self.seeds.distill_init,
                dropout_seed=self.seeds.distill_dropout,
            )
            if cfg.distill.enabled and cfg.schedule.mode != "dense"
            else None
        )
        # The KL term's reference: the initial weights, copied before ZeRO-3 partitions the
        # actor's in place, then held as the actor holds its own (partitioned under ZeRO-3).
        reference = None
        if cfg.rl.loss.kl_coef != 0:
            reference = ReferencePolicy(loaded.model, cfg.actor)
        self.actor = make_actor(loaded.model, cfg.actor)
        reference = reference and reference.place(self.actor)
        self.rank, self.world = self.actor.rank, self.actor.world_size
        self.ranks = Ranks(self.rank, self.world)
        self.run_dir = Path(cfg.run_dir)

        if cfg.rl.prompts_per_step % self.world:
            raise ValueError(
                f"rl.prompts_per_step={cfg.rl.prompts_per_step} must divide over {self.world} ranks"
            )
        self.prompts = PromptIterator(
            self.train_data, cfg.rl.prompts_per_step, self.seeds.data_order
        )

        self.steering = ScheduleSteering(cfg, self.engine, shape, self.ranks)
        self.sampling = SamplingParams(
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k,
            max_tokens=cfg.rollout.max_new_tokens,
            ignore_eos=cfg.rollout.ignore_eos,
        )
        self.reward = build_reward(cfg.rl.reward)
        self.reward_failures = RewardFailures(self.reward, self.ranks)
        self.advantage_fn = make_advantage_fn(cfg.rl.advantage)
        self.policy_update = PolicyUpdate(
            self.actor, PolicyLoss(cfg.rl.loss, cfg.rl.correction), reference, self.ranks, cfg
        )
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", cfg.rl.keep_last)
        self.logger = MetricsLogger(cfg.logger, self.run_dir, asdict(cfg), enabled=self.rank == 0)
        self.monitor = Monitor(
            cfg.monitor,
            self.engine,
            self.actor.model,
            self.ranks,
            self.sampling,
            cfg.rl.group_size,
            cfg.actor,
            self.seeds.speedup,
        )
        self.step = 0
        self.nonfinite_streak = 0
        self.baseline = PairedBaseline()  # the first evaluation's per-prompt scores

    # ---- the loop ---------------------------------------------------------------------------

    def fit(self) -> dict:
        # Before the loop and after it a signal stops at once (nothing to finish); inside it the
        # step in flight is finished and checkpointed first.
        with stop_at_once("start-up", STARTUP_ADVICE):
            self._maybe_resume()
            if self.rank == 0:
                print(self.plan(), flush=True)
            last_eval = None
            if self.cfg.rl.eval.every and self.step == 0:
                last_eval = self._evaluate()
                self.logger.log(0, last_eval)
        clock = StepClock(self.step, self.cfg.rl.steps)
        with GracefulStop() as stop:
            while self.step < self.cfg.rl.steps:
                metrics = self.train_step()
                self.step += 1
                # Before anything of the step is logged or saved: checkpoints hold finite weights.
                check_weights(
                    self.actor.model, self.world, self.step, self.checkpoints.latest_complete
                )
                if self.cfg.rl.eval.every and (
                    self.step % self.cfg.rl.eval.every == 0 or self.step == self.cfg.rl.steps
                ):
                    last_eval = self._evaluate()
                    metrics |= last_eval
                self.logger.log(self.step, metrics)
                if self.rank == 0 and self.step % self.cfg.logger.console_every == 0:
                    line = format_step_line(self.step, self.cfg.rl.steps, metrics)
                    print(f"{line} | {clock.line(self.step)}", flush=True)
                every = self.cfg.rl.save_every
                saved = (every and self.step % every == 0) or self.step == self.cfg.rl.steps
                if saved:
                    self.save()
                if stop.requested(self.world):  # SIGTERM/SIGINT: keep the finished step, exit
                    path = self.checkpoints.root / f"step_{self.step:06d}"
                    if not saved:
                        path = self.save()
                    self.logger.close()
                    raise StopRequested(stop.signum or signal.SIGTERM, self.step, path)
        export_policy(self.actor, self.tokenizer, self.run_dir / "policy", self.step, self.rank)
        self.logger.close()
        return last_eval or {}

    def train_step(self) -> dict:
        """One GRPO step on this rank's share of the step's prompts; returns its metrics."""
        timer = PhaseTimer()
        sampled = self._sample(timer)  # rollout and rewards phases, once per round
        train, drawn = sampled.train, sampled.drawn
        rollout, scores = train.rollout, train.scores
        with timer("rewards"):
            # The overlong penalty shapes the advantages only: accuracy and dynamic sampling's
            # filter read the task's scores (DAPO filters on accuracy).
            rewards, overlong = self._overlong(scores.scores, rollout.batch)  # (B,)
            # GRPO groups never span ranks (a rank rolls out whole groups): advantages are local.
            advantages = self.advantage_fn(rewards, rollout.batch.group_ids)  # (B,)
        with timer("logprobs"):
            dense = self._logprobs(rollout.batch)
        with timer("monitor"):
            acceptance = self._acceptance(train.prompts, rollout, dense)
            drawn.rollout.free_logits()  # the groups dynamic sampling dropped hold theirs too
        with timer("control"):
            control = self.steering.update(rollout.batch, acceptance.stats)
        with timer("update"):
            num_tokens = self.ranks.sum(rollout.batch.completion_mask.sum())
            token_advantages = broadcast_to_tokens(advantages, rollout.batch.completion_mask)
            masked = overlong["masked"]
            if sampled.padding is not None:  # dynamic sampling's padding rows: out of the loss
                masked = sampled.padding if masked is None else masked | sampled.padding
            update = self._policy_update(rollout.batch, dense, token_advantages, num_tokens, masked)
        with timer("distill"):
            # The updated theta, gathered once (a collective under ZeRO-3) for the adapter's
            # frozen base and for the engine; a frozen theta (rl.update_policy=false) is in both.
            weights = self.actor.gathered_state_dict() if self.cfg.rl.update_policy else None
            distill = self._distill_update(
                rollout.batch, dense, token_advantages, num_tokens, weights
            )
        with timer("sync"):
            self._sync_engine(weights, theta_changed=self.cfg.rl.update_policy)
        times = timer.metrics()  # the phases tile the step; reporting below is not timed
        self._log_histograms(acceptance.histograms)
        # What the engine drew (with dynamic sampling: every round), not only what trained.
        metrics = rollout_metrics(
            drawn.rollout.batch, drawn.scores, drawn.rollout.outputs, self.ranks
        )
        metrics["rollout/preemptions"] = self.ranks.sum(drawn.rollout.stats.num_preemptions)
        metrics |= acceptance.metrics | control | self.steering.kv_read(drawn.rollout.batch)
        metrics |= sampled.metrics | update_metrics(update | distill) | overlong["metrics"]
        metrics |= self.ranks.sums(drawn.scores.stats.as_metrics())
        self.reward_failures.check(self.step + 1, metrics)
        return metrics | times | throughput_metrics(metrics["rollout/tokens"], self.world, times)

    # ---- the phases -------------------------------------------------------------------------

    def _sample(self, timer: PhaseTimer) -> Sampled:
        """This step's rollouts and rewards: one round of prompts, or with dynamic sampling as
        many rounds as it takes to fill the step with groups that carry signal."""

        def draw() -> Round:
            with timer("rollout"):
                prompts = next(self.prompts)[self.rank :: self.world]
                rollout = self._rollout(prompts)
            with timer("rewards"):
                return Round(prompts, rollout, self._rewards(prompts, rollout.outputs))

        rl = self.cfg.rl
        share = rl.prompts_per_step // self.world
        return sample_step(
            draw, rl.dynamic_sampling, share, rl.group_size, self.ranks, self._collate
        )

    def _rollout(self, prompts) -> Rollout:
        """Sparse rollouts of `prompts` (the noise-floor share dense), collated into a batch."""
        # A gated adapter never acts on dense rows: the engine's dense decode is then theta's.
        dense_is_theta = self.distill is None or self.distill.cfg.gate
        plan = self.monitor.plan(len(prompts), dense_is_theta)
        outputs = self.engine.generate(
            [p.token_ids for p in prompts],
            replace(self.sampling, return_logits=plan.logit_rows is not None),
            n=self.cfg.rl.group_size,
            progress=self.cfg.rollout.progress and self.rank == 0,
            schedules=plan.schedules,
            logits_rows=plan.logit_rows,
        )
        return self._collate(prompts, outputs, plan, self.engine.last_stats)

    def _collate(self, prompts, outputs, plan: RolloutPlan, stats) -> Rollout:
        """The outputs of `prompts` (this rank's, `outputs` prompt-major) as one padded batch;
        group ids are the prompts' places in the step (every rank holds as many)."""
        group_offset = self.rank * len(prompts)
        batch = collate_rollouts(
            [p.token_ids for p in prompts],
            outputs,
            self.tokenizer.pad_token_id,
            [group_offset + o.prompt_index for o in outputs],
        )
        return Rollout(outputs, batch, plan, stats)

    def _rewards(self, prompts, outputs) -> BatchScores:
        return score_batch(
            self.reward,
            [prompts[o.prompt_index].text for o in outputs],
            [o.text for o in outputs],
            [prompts[o.prompt_index].answer for o in outputs],
        )

    def _logprobs(self, batch: RolloutBatch) -> LogprobOutput:
        """The dense policy's log-probs and top-K of the batch, at the rollout temperature (so
        that ratios, TIS and acceptance compare like with like)."""
        return self.actor.compute_logprobs(
            batch.input_ids,
            batch.attention_mask,
            topk=self.cfg.monitor.top_k,
            temperature=self.cfg.rollout.temperature,
            prompt_lens=batch.prompt_lens,
            group_ids=batch.group_ids,
        )

    def _acceptance(self, prompts, rollout: Rollout, dense: LogprobOutput) -> AcceptanceResult:
        """The monitor's measurement of the step (under the schedule the batch was rolled out
        with: call before the controller moves it); the outputs' kept logits are freed with the
        batch's before the update."""
        ids = [p.token_ids for p in prompts]
        result = self.monitor.measure(
            self.step, ids, rollout.batch, rollout.plan, dense, rollout.stats
        )
        rollout.free_logits()
        return result

    def _overlong(self, scores, batch: RolloutBatch) -> tuple:
        """The rewards the advantages see (the task's scores plus DAPO's soft overlong penalty)
        and {"masked": (B,) bool rows the loss leaves out or None, "metrics": overlong/*}."""
        cfg = self.cfg.rl.overlong
        truncated = truncated_rows(batch.finish_reasons)  # (B,)
        lengths = batch.completion_mask.sum(-1)  # (B,)
        penalty = overlong_penalty(lengths, self.cfg.rollout.max_new_tokens, cfg)  # (B,)
        metrics = {}
        if cfg.buffer or cfg.mask_truncated:
            n = len(batch)
            metrics = {
                "overlong/penalty_mean": self.ranks.mean(float(penalty.sum()), n),
                "overlong/truncated_frac": self.ranks.mean(float(truncated.sum()), n),
            }
        masked = truncated if cfg.mask_truncated else None
        return scores + penalty, {"masked": masked, "metrics": metrics}

    def _policy_update(
        self, batch: RolloutBatch, dense, token_advantages, num_tokens, masked_rows=None
    ) -> dict:
        """One GRPO/TIS update of theta (train/policy_update.py); a non-finite update counts
        towards rl.max_nonfinite_streak."""
        outcome = self.policy_update(
            batch, dense, token_advantages, num_tokens, masked_rows, self.step
        )
        if outcome.ran:
            self.nonfinite_streak = next_nonfinite_streak(
                self.nonfinite_streak,
                outcome.metrics,
                self.step + 1,
                self.cfg.rl.max_nonfinite_streak,
            )
        return outcome.metrics

    def _distill_update(self, batch, dense, token_advantages, num_tokens, weights) -> dict:
        """DistillSparse: one adapter update on the frozen updated theta (`weights`; None: theta
        did not change, the adapter's base already holds it)."""
        if self.distill is None:
            return {}
        if weights is not None:
            self.distill.load_base(weights)
        metrics = self.distill.step(
            batch,
            dense.token_logprobs,
            token_advantages,
            self.cfg.rollout.temperature,
            num_tokens,
            dense_topk=(dense.topk_ids, dense.topk_logprobs),
        )
        # Its loss terms are this rank's share of global-token means (they add up over ranks);
        # the gradient norm is taken after the all-reduce, already global.
        grad_norm = metrics.pop("distill/grad_norm")
        return self.ranks.sums(metrics) | {"distill/grad_norm": grad_norm}

    def _sync_engine(self, weights: dict | None = None, theta_changed: bool = True) -> None:
        """The rollout policy's weights into the engine: theta (`weights`, gathered when not
        given; skipped when not `theta_changed`); with DistillSparse also phi, unmerged and gated
        to sparse decode steps (distill.gate), or merged into theta."""
        if self.distill is not None and not self.distill.cfg.gate:
            self.engine.update_weights(self.distill.merged_state_dict())
            return
        if theta_changed:
            self.engine.update_weights(weights or self.actor.gathered_state_dict())
        if self.distill is not None:
            self.engine.set_lora(self.distill.lora_factors())

    def _log_histograms(self, histograms: dict[str, list[float]]) -> None:
        for name, values in histograms.items():
            self.logger.log_histogram(self.step + 1, name, values)

    # ---- around the steps -------------------------------------------------------------------

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
        result, correct = evaluate(
            self.engine, self.reward, prompts, params, self.ranks.sum, self.seeds.eval(self.step)
        )
        if merged:
            self._sync_engine()
        self.steering.push()
        result |= self.baseline.delta(self.ranks.gather_strided(correct))
        if self.rank == 0:
            print(format_eval_line(self.step, result), flush=True)
        return result

    def plan(self) -> str:
        return (
            format_plan(
                self.cfg,
                self.train_data.summary(),
                self.world,
                self.actor.model.config,
                self.train_data.prompt_lengths(),
                self.seeds.describe(),
            )
            + f"\n  {self.memory.line()}"
        )
