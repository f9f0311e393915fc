"""One step's rollouts and rewards on this rank's engine, apart from the trainer: the part of the
GRPO step that needs the engine, the prompts and the reward, and no actor. The synchronous loop
calls it in the step; the asynchronous one (pipeline.py) in its producer thread, where
`drawn_step` adds the same-weights dense replay the monitor measures the rows against.

    draw = RolloutDraw(cfg, engine, plan, prompts, tokenizer, reward, ranks)
    sampled = draw(timer)                # the rounds (dynamic sampling) and their rewards
    drawn = draw.drawn_step(step)        # the same, with the replay, as the producer hands it
    draw.version = step + 1              # after the engine loaded the weights of update `step`

With rollout ranks (cluster.rollout_ranks, train/rollouts/remote.py) a training rank asks for its
draw with `draw.request()` (the step's prompts, the rollout plan, the engine's schedule and its
sampling seed: everything the draw depends on besides the weights), and the rollout rank's own
RolloutDraw, made for that training rank's place, draws it with `draw.drawn_from(step, request,
version)`. A rollout rank so holds no state a checkpoint must keep, and draws what the training
rank's own engine would have drawn from the same weights.
"""

from collections.abc import Callable
from dataclasses import replace

from sparrow.distributed import Ranks
from sparrow.monitor.rollout_plan import RolloutPlan
from sparrow.monitor.same_weights import same_weights_dense
from sparrow.rl.batch import collate_rollouts
from sparrow.tasks.rewards import BatchScores, score_batch
from sparrow.train.build import rollout_sampling
from sparrow.train.config import SparrowConfig
from sparrow.train.dynamic_sampling import Rollout, Round, Sampled, sample_step
from sparrow.train.phase_timer import PhaseTimer
from sparrow.train.rollouts.drawn import DrawnStep
from sparrow.train.rollouts.episodes import Episodes


class RolloutDraw:
    def __init__(
        self,
        cfg: SparrowConfig,
        engine,
        plan: Callable[[int], RolloutPlan],
        prompts,
        tokenizer,
        reward,
        ranks: Ranks,
    ):
        """`plan(num_prompts)`: the rollout's noise-floor and kept-logit rows under the engine's
        schedule (Monitor.plan); `prompts`: the step's PromptIterator, shared by every rank
        (each takes its stride); `reward`: the task's GuardedReward."""
        self.cfg, self.engine, self.plan, self.ranks = cfg, engine, plan, ranks
        self.prompts, self.tokenizer, self.reward = prompts, tokenizer, reward
        self.sampling = rollout_sampling(cfg.rollout)
        self.version = 0  # the step whose weights the engine holds (rows' weight_version)
        self.seed: int | None = None  # None: the engine's own stream; else a request's seed
        # env.function: each sample is a multi-turn episode with its environment, rewarded by
        # it (train/rollouts/episodes.py); the environments run here, where the rollout runs.
        self.episodes = None
        if cfg.env.function:
            self.episodes = Episodes(cfg.env, tokenizer, engine, cfg.rollout.max_new_tokens)

    def __call__(self, timer: PhaseTimer) -> Sampled:
        """One step's rollouts and rewards: one round of prompts, or with dynamic sampling as
        many rounds as it takes to fill the step with groups that carry signal."""
        rank, world = self.ranks.rank, self.ranks.world

        def draw() -> Round:
            with timer("rollout"):
                prompts = next(self.prompts)[rank::world]
                rollout = self.rollout(prompts)
            with timer("rewards"):
                return Round(prompts, rollout, self.rewards(prompts, rollout.outputs))

        rl = self.cfg.rl
        share = rl.prompts_per_step // world
        return sample_step(
            draw, rl.dynamic_sampling, share, rl.group_size, self.ranks, self.collate
        )

    def close(self) -> None:
        """The run is over: the environments' worker process, if any, ends (env.isolate)."""
        if self.episodes is not None:
            self.episodes.close()

    def drawn_step(self, step: int) -> DrawnStep:
        """The producer's work for step `step` (on the engine's weights of now): the rounds and
        rewards, then the dense replay of the trained rows' monitored share on the same weights
        (monitor/same_weights.py); the kept logits freed."""
        timer = PhaseTimer()
        sampled = self(timer)
        rollout = sampled.train.rollout
        with timer("same_weights"):
            same = same_weights_dense(
                self.engine,
                rollout.batch,
                rollout.plan,
                self.cfg.rollout.temperature,
                self.cfg.rollout.engine.topk_logprobs,
                self.cfg.monitor.exact_fraction,
            )
            sampled.free_logits()
        # async/<phase>_s in the producer's thread, async/draw_s the whole draw
        times = {k.replace("time/", "async/"): v for k, v in timer.metrics().items()}
        times["async/draw_s"] = times.pop("async/step_s")
        return DrawnStep(step, sampled, self.version, same, times)

    def request(self) -> dict:
        """What a rollout rank needs to draw this rank's next step (picklable): the step's
        prompts, the plan and schedule of now, and the seed the engine's next generate call
        would take, spent here as a local draw would spend it (its count is checkpointed)."""
        prompts = next(self.prompts)
        share = len(prompts[self.ranks.rank :: self.ranks.world])
        seed = self.engine.seed + self.engine.num_generate_calls
        self.engine.num_generate_calls += 1
        return {
            "rank": self.ranks.rank,
            "prompts": prompts,
            "plan": self.plan(share),
            "schedule": self.engine.schedule,
            # The speculative rounds' k (the throughput controller's), None without them.
            "draft_tokens": spec.draft_tokens if (spec := self.engine.speculative) else None,
            "seed": seed,
        }

    def drawn_from(self, step: int, request: dict, version: int) -> DrawnStep:
        """On a rollout rank: `step`'s draw as `request` (a training rank's `request()`) asks,
        on this engine's weights of `version`."""
        assert request["rank"] == self.ranks.rank, "a draw made for another training rank"
        self.engine.set_schedule(request["schedule"])
        if request["draft_tokens"] is not None:
            self.engine.set_draft_tokens(request["draft_tokens"])
        self.prompts = iter([request["prompts"]])
        self.plan = lambda num_prompts: request["plan"]
        self.seed, self.version = request["seed"], version
        return self.drawn_step(step)

    def rollout(self, prompts) -> Rollout:
        """Sparse rollouts of `prompts` (the noise-floor share dense), collated into a batch."""
        plan = self.plan(len(prompts))
        params = replace(self.sampling, return_logits=plan.logit_rows is not None)
        n, seed = self.cfg.rl.group_size, self.seed
        if self.episodes is not None:
            outputs = self.episodes.generate(
                prompts, params, n, schedules=plan.schedules, logits_rows=plan.logit_rows, seed=seed
            )
        else:
            outputs = self.engine.generate(
                [p.token_ids for p in prompts],
                params,
                n=n,
                progress=self.cfg.rollout.progress and self.ranks.rank == 0,
                schedules=plan.schedules,
                logits_rows=plan.logit_rows,
                seed=seed,
            )
        return self.collate(prompts, outputs, plan, self.engine.last_stats)

    def collate(self, prompts, outputs, plan: RolloutPlan, stats) -> Rollout:
        """The outputs of `prompts` (this rank's, `outputs` prompt-major) as one padded batch;
        group ids are the prompts' places in the step (every rank holds as many)."""
        group_offset = self.ranks.rank * len(prompts)
        # An episode's prompt is its environment's first messages rendered, not the row's text.
        rendered = {o.prompt_index: o.prompt_ids for o in outputs}
        batch = collate_rollouts(
            [rendered.get(i, p.token_ids) for i, p in enumerate(prompts)],
            outputs,
            self.tokenizer.pad_token_id,
            [group_offset + o.prompt_index for o in outputs],
            weight_version=self.version,  # unchanged while a draw runs (pipeline.wait)
        )
        return Rollout(outputs, batch, plan, stats)

    def rewards(self, prompts, outputs) -> BatchScores:
        if self.episodes is not None:
            return self.episodes.scores(outputs)
        return score_batch(
            self.reward,
            [prompts[o.prompt_index].text for o in outputs],
            [o.text for o in outputs],
            [prompts[o.prompt_index].answer for o in outputs],
        )
