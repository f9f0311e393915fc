"""The GRPO loop. One step, in `train_step`: sparse rollout (as the monitor planned it) -> rewards
(with dynamic sampling, rounds of both until the step holds its groups with signal) -> advantages
-> policy update, whose forward also gives the dense log-probs, top-K and exact acceptance
(rl.dense_pass=update; `separate`: a dense pass before it) -> the monitor's acceptance ->
controller update (the next rollout's schedule) -> DistillSparse update -> weight sync ->
logging; `fit` adds evaluation and checkpoints around the steps.

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
import signal
from dataclasses import asdict
from pathlib import Path

from sparrow.cluster import Roles
from sparrow.distributed import Ranks
from sparrow.malloc import trim_heap
from sparrow.rl.advantages import broadcast_to_tokens, make_advantage_fn
from sparrow.rl.batch import RolloutBatch
from sparrow.rl.losses import PolicyLoss
from sparrow.rl.overlong import overlong_shaping
from sparrow.rl.policy_logprobs import LogprobOutput
from sparrow.tasks.data import PromptIterator
from sparrow.tasks.rewards import build_reward
from sparrow.train.build import (
    PreparedRun,
    build_actor,
    build_distill,
    build_engine,
    build_monitor,
    check_prompt_split,
    prepare_run,
)
from sparrow.train.config import SparrowConfig
from sparrow.train.dynamic_sampling import Rollout, Sampled
from sparrow.train.evaluation import PairedBaseline, eval_sampling, evaluate
from sparrow.train.logs.metrics_logger import MetricsLogger
from sparrow.train.logs.progress import StepClock
from sparrow.train.memory.peaks import phase_peaks
from sparrow.train.phase_timer import PhaseTimer
from sparrow.train.policy_update import PolicyUpdate, dense_pass
from sparrow.train.rollouts.draw import RolloutDraw
from sparrow.train.rollouts.source import RolloutSource, check_staleness
from sparrow.train.run.policy_export import export_policy
from sparrow.train.run.state import RunState
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


class GRPOTrainer:
    """The GRPO loop over the parts `build.py` makes; `RunState` (run/state.py) holds the step
    and what checkpoints save."""

    @classmethod
    def from_config(
        cls,
        cfg: SparrowConfig,
        make_actor=None,
        pinned: frozenset[str] = frozenset(),
        roles: Roles | None = None,
    ) -> "GRPOTrainer":
        """Sized first (the memory fit returns the config the run uses), then built. `pinned`:
        keys the user set, which the fit leaves as set; `make_actor`: see build_actor; `roles`:
        a training rank's place in a world with rollout ranks (train/rollouts/rank.py)."""
        return cls(prepare_run(cfg, pinned), make_actor, roles)

    def __init__(self, run: PreparedRun, make_actor=None, roles: Roles | None = None):
        cfg = self.cfg = run.cfg
        self.tokenizer, self.seeds, self.memory = run.tokenizer, run.seeds, run.memory
        self.train_data, self.eval_data = run.train_data, run.eval_data
        self.engine = build_engine(run)
        self.distill = build_distill(run, self.engine)
        self.actor, reference = build_actor(run, make_actor)
        self.ranks = Ranks(self.actor.rank, self.actor.world_size)
        self.rank, self.world = self.ranks.rank, self.ranks.world
        check_prompt_split(cfg.rl.prompts_per_step, self.world)
        self.prompts = PromptIterator(run.train_data, cfg.rl.prompts_per_step, run.seeds.data_order)
        self.steering = ScheduleSteering(cfg, self.engine, run.shape, self.ranks)
        reward = build_reward(cfg.rl.reward)  # the draw's, read by evaluation too (draw.reward)
        self.reward_failures = RewardFailures(reward, self.ranks)
        self.advantage_fn = make_advantage_fn(cfg.rl.advantage)
        loss = PolicyLoss(cfg.rl.loss, cfg.rl.correction)
        self.policy_update = PolicyUpdate(self.actor, loss, reference, self.ranks, cfg)
        self.dense_pass, self.dense_pass_why = dense_pass(cfg)  # "update" or "separate"
        self.run_dir = Path(cfg.run_dir)
        self.logger = MetricsLogger(cfg.logger, self.run_dir, asdict(cfg), enabled=self.rank == 0)
        self._build_rollout_side(run, reward, roles)
        self.run = RunState(
            cfg,
            self.ranks,
            actor=self.actor,
            prompts=self.prompts,
            steering=self.steering,
            engine=self.engine,
            distill=self.distill,
            baseline=PairedBaseline(),  # the first evaluation's per-prompt scores
            logger=self.logger,
            pending_rollout=self.source.pipeline,
        )

    def _build_rollout_side(self, run: PreparedRun, reward, roles: Roles | None) -> None:
        """The draw, the monitor that measures its rows, and the source the loop takes them
        from (its own draw, or a producer)."""
        # A gated adapter never acts on dense rows: the engine's dense decode is then theta's.
        dense_is_theta = self.distill is None or self.distill.cfg.gate
        self.draw = RolloutDraw(
            self.cfg,
            self.engine,
            lambda num_prompts: self.monitor.plan(num_prompts, dense_is_theta),
            self.prompts,
            self.tokenizer,
            reward,
            self.ranks,
        )
        # The speedup probe re-rolls out with the draw's own SamplingParams (one object).
        self.monitor = build_monitor(run, self.engine, self.actor, self.ranks, self.draw.sampling)
        check_staleness(self.cfg.rl.async_rollout.staleness, self.world, self.distill)
        self.source = RolloutSource(
            self.cfg, self.draw, self.monitor, self.steering, self.ranks, roles
        )

    @property
    def step(self) -> int:
        return self.run.step

    @step.setter
    def step(self, value: int) -> None:
        self.run.step = value

    @property
    def checkpoints(self):
        return self.run.checkpoints

    def save(self) -> Path:
        return self.run.save()

    def resume(self) -> None:
        """Resume as `resume` says (run/state.py); the loaded weights then go to the engine."""
        if self.run.resume():
            self._sync_engine()
            self.steering.push()
        self.draw.version = self.step
        self.source.push(self.actor, self.step)  # rollout ranks start from the trainers' weights

    # ---- the loop ---------------------------------------------------------------------------

    def fit(self) -> dict:
        # Before the loop and after it a signal stops at once (nothing to finish); inside it the
        # step in flight is finished and checkpointed first.
        with stop_at_once("start-up", STARTUP_ADVICE):
            self.resume()
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
                    self.source.close()
                    self.draw.close()
                    raise StopRequested(stop.signum or signal.SIGTERM, self.step, path)
        self.source.close()  # the rollout ranks' loop ends with the trainers'
        self.draw.close()  # the environments' worker (env.isolate) ends with the run
        base = {k: v for k, v in asdict(self.cfg.model).items() if k != "dtype"}
        policy = self.run_dir / "policy"
        export_policy(self.actor, self.tokenizer, policy, self.step, self.rank, base)
        self.logger.close()
        return last_eval or {}

    def train_step(self) -> dict:
        """One GRPO step on this rank's share of the step's prompts; returns its metrics."""
        # With memory.measure_phases, each phase's peak memory too (memory/peaks.py).
        timer = PhaseTimer(phase_peaks() if self.cfg.memory.measure_phases else None)
        sampled = self._sample(timer)  # rollout and rewards phases, once per round
        train = sampled.train
        rollout, scores = train.rollout, train.scores
        with timer("rewards"):
            # The overlong penalty shapes the advantages only: accuracy and dynamic sampling's
            # filter read the task's scores (DAPO filters on accuracy).
            rewards, overlong = self._overlong(scores.scores, rollout.batch)  # (B,)
            # GRPO groups never span ranks (a rank rolls out whole groups): advantages are local.
            advantages = self.advantage_fn(rewards, rollout.batch.group_ids)  # (B,)
        # Asynchronous: measured and steered when the rollout was taken (`_sample`); the update
        # then scores the rows itself, and the engine, busy with the next draw, is not asked.
        steered = sampled.steered
        if steered is not None and self.dense_pass == "update":
            dense, row_logits = None, None
        else:
            dense, row_logits = self._before_update(timer, rollout)
        if steered is None and dense is not None:  # separate: measured before the weights move
            steered = self._measure_and_steer(timer, train.prompts, rollout, sampled, dense)
        self._sleep_engine(free_weights=not self.monitor.probes_speedup(self.step))
        with timer("update"):
            num_tokens = self.ranks.sum(rollout.batch.completion_mask.sum())
            token_advantages = broadcast_to_tokens(advantages, rollout.batch.completion_mask)
            masked = overlong["masked"]
            if sampled.padding is not None:  # dynamic sampling's padding rows: out of the loss
                masked = sampled.padding if masked is None else masked | sampled.padding
            update, scored = self._policy_update(
                rollout.batch, dense, token_advantages, num_tokens, masked, row_logits
            )
            # The update's freed activations go back to the kernel before the phases after it
            # (glibc keeps up to 2 GB of free heap, sparrow.malloc): each phase holds its own.
            trim_heap()
        dense, exact = scored or self._after_update(timer, rollout.batch, dense)
        if steered is None:  # the update's forward measured the exact rows
            steered = self._measure_and_steer(timer, train.prompts, rollout, sampled, dense, exact)
        acceptance, control = steered
        self._sleep_engine()  # woken by the monitor's speedup probe, if it ran
        with timer("distill"):
            # The updated theta, gathered once (a collective under ZeRO-3) for the adapter's
            # frozen base and for the engine; a frozen theta (rl.update_policy=false) is in both.
            # LoRA RL without DistillSparse needs no full weights: the sync pushes the adapter.
            lora_only = self.cfg.actor.lora.rank > 0 and self.distill is None
            gather = self.cfg.rl.update_policy and not lora_only
            weights = self.actor.gathered_state_dict() if gather else None
            distill = self._distill_update(
                rollout.batch, dense, token_advantages, num_tokens, weights
            )
        if self.source.produced:
            with timer("rollout_wait"):  # the engine's weights never change under a generate
                self.source.wait()
        with timer("sync"):
            self.engine.wake()  # a freed weight copy is refilled by the sync's full push
            synced = self._sync_engine(weights, theta_changed=self.cfg.rl.update_policy)
            self.draw.version = self.step + 1
            pushed = self.source.push(self.actor, self.step + 1) | synced
        times = timer.metrics()  # the phases tile the step; reporting below is not timed
        self._log_histograms(acceptance.histograms)
        metrics = self._step_metrics(sampled, acceptance.metrics | control, update | distill)
        metrics |= overlong["metrics"] | pushed
        self.reward_failures.check(self.step + 1, metrics)
        # Asynchronous: the rollout's throughput over its own time in the producer, not the wait.
        produced = self.source.produced
        drawn_time = {"time/rollout_s": metrics["async/rollout_s"]} if produced else {}
        throughput = throughput_metrics(metrics["rollout/tokens"], self.world, times | drawn_time)
        return metrics | times | throughput

    def _step_metrics(self, sampled: Sampled, monitored: dict, updated: dict) -> dict:
        """The step's metrics but its times: what the engine drew (with dynamic sampling every
        round, not only what trained), the monitor's and controller's, the updates'."""
        drawn = sampled.drawn
        metrics = rollout_metrics(
            drawn.rollout.batch, drawn.scores, drawn.rollout.outputs, self.ranks
        )
        metrics["rollout/preemptions"] = self.ranks.sum(drawn.rollout.stats.num_preemptions)
        metrics |= monitored | self.steering.kv_read(drawn.rollout.batch)
        metrics |= sampled.metrics | update_metrics(updated)
        return metrics | self.ranks.sums(drawn.scores.stats.as_metrics())

    # ---- the phases -------------------------------------------------------------------------

    def _sample(self, timer: PhaseTimer) -> Sampled:
        """This step's rollouts and rewards (rollouts/source.py: drawn now, or the producer's
        draw, measured and steered at once while the next one starts)."""
        return self.source.sample(self.step, timer)

    def _measure_and_steer(
        self, timer: PhaseTimer, prompts, rollout: Rollout, sampled: Sampled, dense, exact=None
    ) -> tuple:
        """(the monitor's acceptance of the step, the controller's move on it: the next
        rollout's schedule); the rollout logits are freed once read. `exact` (B, T): the exact
        acceptance the update's forward measured, None: the monitor's own pass (before the
        update only)."""
        with timer("monitor"):  # under the schedule the batch was rolled out with
            ids = [p.token_ids for p in prompts]
            acceptance = self.monitor.measure(
                self.step, ids, rollout.batch, rollout.plan, dense, rollout.stats, exact
            )
            sampled.free_logits()
        with timer("control"):
            control = self.steering.update(rollout.batch, acceptance.stats, rollout.stats)
        return acceptance, control

    def _before_update(self, timer: PhaseTimer, rollout: Rollout) -> tuple:
        """(dense, row_logits): rl.dense_pass=separate: the dense pass's LogprobOutput, None;
        update: None, the exact rows' rollout logits for the update's forward to measure."""
        if self.dense_pass == "separate":
            self._sleep_engine(free_weights=False)  # the monitor's engine passes come next
            with timer("logprobs"):
                return self._logprobs(rollout.batch), None
        with timer("monitor"):
            return None, self.monitor.rollout_logits(rollout.batch, rollout.plan)

    def _after_update(self, timer: PhaseTimer, batch: RolloutBatch, dense) -> tuple:
        """(dense, None) when the update's forward scored nothing: the separate pass's `dense`,
        or, when no update forward ran (no signal, frozen theta), a dense pass now (the weights
        are still those the batch was rolled out with)."""
        if dense is None:
            self._sleep_engine(free_weights=not self.monitor.probes_speedup(self.step))
            with timer("logprobs"):
                dense = self._logprobs(batch)
        return dense, None

    def _logprobs(self, batch: RolloutBatch) -> LogprobOutput:
        """The dense policy's log-probs and top-K of the batch, at the rollout temperature (so
        that ratios, TIS and acceptance compare like with like)."""
        return self.actor.compute_logprobs(
            batch.input_ids,
            batch.attention_mask,
            topk=self.cfg.rollout.engine.topk_logprobs,
            temperature=self.cfg.rollout.temperature,
            prompt_lens=batch.prompt_lens,
            group_ids=batch.group_ids,
        )

    def _overlong(self, scores, batch: RolloutBatch) -> tuple:
        """The rewards the advantages see and what the loss leaves out (rl/overlong.py)."""
        cfg, max_new = self.cfg.rl.overlong, self.cfg.rollout.max_new_tokens
        return overlong_shaping(scores, batch, max_new, cfg, self.ranks)

    def _policy_update(
        self, batch: RolloutBatch, dense, token_advantages, num_tokens, masked_rows, row_logits
    ) -> tuple[dict, tuple | None]:
        """One GRPO/TIS update of theta (train/policy_update.py); a non-finite update counts
        towards rl.max_nonfinite_streak. Returns its metrics and, when `dense` is None and the
        update ran, what its forward scored: (LogprobOutput, (B, T) exact acceptance or None)."""
        outcome = self.policy_update(
            batch, dense, token_advantages, num_tokens, masked_rows, self.step, row_logits
        )
        if outcome.ran:
            self.run.nonfinite_streak = next_nonfinite_streak(
                self.run.nonfinite_streak,
                outcome.metrics,
                self.step + 1,
                self.cfg.rl.max_nonfinite_streak,
            )
        scored = None if outcome.dense is None else (outcome.dense, outcome.exact)
        return outcome.metrics, scored

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

    def _sync_engine(self, weights: dict | None = None, theta_changed: bool = True) -> dict:
        """The rollout policy's weights into the engine: theta (`weights`, gathered when not
        given; skipped when not `theta_changed`), or with actor.lora the policy's adapter alone
        (the engine keeps the base); with DistillSparse also phi, unmerged and gated to sparse
        decode steps (distill.gate), or merged into theta. Waits for an in-flight rollout
        first: the engine's weights never change under a generate. The bytes it loaded."""
        self.source.wait()
        if self.distill is not None and not self.distill.cfg.gate:
            self.engine.update_weights(self.distill.merged_state_dict())
            return {}
        loaded = 0
        if theta_changed and self.cfg.actor.lora.rank:  # LoRA RL: the adapter, not theta
            loaded = self.engine.set_policy_lora(self.actor.adapter_factors())
        elif theta_changed:
            state = weights or self.actor.gathered_state_dict()
            self.engine.update_weights(state)
            itemsize = self.engine.runner.model.dtype.itemsize
            loaded = sum(t.numel() for t in state.values()) * itemsize
        if self.distill is not None:
            self.engine.set_lora(self.distill.lora_factors())
        return {"sync/engine_bytes": float(loaded)} if theta_changed else {}

    def _sleep_engine(self, free_weights: bool = True) -> None:
        """Before an actor phase, the engine's memory handed to it (rollout.engine.sleep,
        rollout/sleep.py) until the sync wakes it, or a monitor pass on the engine does.
        `free_weights`: False while an engine pass with the rollout's weights may still come."""
        level = self.cfg.rollout.engine.sleep
        if level == "weights" and not (free_weights and self.cfg.rl.update_policy):
            level = "kv"  # a frozen theta is not pushed again: its copy stays
        self.engine.sleep(level)

    def _log_histograms(self, histograms: dict[str, list[float]]) -> None:
        for name, values in histograms.items():
            self.logger.log_histogram(self.step + 1, name, values)

    # ---- around the steps -------------------------------------------------------------------

    def _evaluate(self) -> dict:
        ecfg = self.cfg.rl.eval
        prompts = self.eval_data.prompts[: ecfg.num_prompts][self.rank :: self.world]
        params, sample_params = eval_sampling(ecfg.temperature, ecfg.max_new_tokens, ecfg.samples)
        # The dense policy is what is trained and scored: evaluate without sparsity (and, with
        # DistillSparse, without the adapter: a gated one is off at dense steps by itself).
        self.engine.set_schedule(None)
        merged = self.distill is not None and not self.distill.cfg.gate
        if merged:
            self.engine.update_weights(self.actor.gathered_state_dict())
        result, correct = evaluate(
            self.engine,
            self.draw.reward,
            prompts,
            params,
            self.ranks.sum,
            self.seeds.eval(self.step),
            samples=ecfg.samples,
            sample_params=sample_params,
            episodes=self.draw.episodes,  # env.function: pass@k over multi-turn episodes
        )
        if merged:
            self._sync_engine()
        self.steering.push()
        result |= self.run.baseline.delta(self.ranks.gather_strided(correct))
        self.reward_failures.check_eval(result, f"in the evaluation at step {self.step}")
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
            + f"\n  dense log-probs: {self.dense_pass_why}"
            + self.source.plan_line()
            + f"\n  {self.memory.line()}"
        )
