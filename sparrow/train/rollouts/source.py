"""Where a step's rows come from: drawn in the step on this rank's engine (rl.async.staleness=0,
one process), or taken from a producer, which is a thread of this process drawing one step
ahead (staleness 1, pipeline.py) or the rollout ranks (cluster.rollout_ranks,
remote.py). A producer's rows are measured at once against the dense policy of the
weights that sampled them (their same-weights replay), the controller moves on that, and the
next step's draw is asked for, so that it overlaps the rest of the step.

    source = RolloutSource(cfg, draw, monitor, steering, ranks, roles)
    sampled = source.sample(step, timer)     # rollout, rewards (and, produced, monitor, control)
    ...                                      # the update
    source.wait(); pushed = source.push(actor, step + 1)
"""

from sparrow.cluster import Roles
from sparrow.distributed import Ranks
from sparrow.monitor.monitor import Monitor
from sparrow.train.config import SparrowConfig
from sparrow.train.dynamic_sampling import Sampled, staleness_metrics
from sparrow.train.phase_timer import PhaseTimer
from sparrow.train.rollouts.draw import RolloutDraw
from sparrow.train.rollouts.pipeline import RolloutPipeline
from sparrow.train.rollouts.remote import RemoteRollouts
from sparrow.train.schedule_steering import ScheduleSteering


def check_staleness(staleness: int, world: int, distill) -> None:
    """Refuse what a producer one step ahead cannot do yet (`distill`: the run's DistillSparse
    or None)."""
    if staleness and world > 1:  # a checkpoint holds rank 0's pending draw only
        raise ValueError("rl.async.staleness=1 runs on one training rank for now")
    if staleness and distill is not None and not distill.cfg.gate:
        # The same-weights replay is the engine's dense decode: theta + phi once merged.
        raise ValueError("rl.async.staleness=1 needs distill.gate=true (phi unmerged)")


class RolloutSource:
    """The trainer's rows, from its own draw or from a producer (`pipeline`)."""

    def __init__(
        self,
        cfg: SparrowConfig,
        draw: RolloutDraw,
        monitor: Monitor,
        steering: ScheduleSteering,
        ranks: Ranks,
        roles: Roles | None,
    ):
        """`draw`: this rank's RolloutDraw (its engine's dtype is the push's); `roles`: a
        training rank's place in a world with rollout ranks, None without them."""
        self.cfg, self.draw, self.ranks = cfg, draw, ranks
        self.monitor, self.steering = monitor, steering
        self.staleness = cfg.rl.async_rollout.staleness
        self.roles = roles
        self.pipeline: RolloutPipeline | RemoteRollouts
        if roles is None:  # a thread of this process (idle at staleness 0)
            self.pipeline = RolloutPipeline(draw.drawn_step)
        else:
            bucket_bytes = int(cfg.cluster.push_bucket_mb * 2**20)
            dtype = draw.engine.runner.model.dtype
            self.pipeline = RemoteRollouts(
                roles,
                lambda step: draw.request(),
                bucket_bytes,
                dtype,
                adapter=cfg.actor.lora.rank > 0,  # LoRA RL: the adapter alone goes over the wire
            )
        self.produced = self.staleness > 0 or roles is not None  # the rows come from it

    def sample(self, step: int, timer: PhaseTimer) -> Sampled:
        """Step `step`'s rollouts and rewards: drawn now (synchronous), or the producer's draw,
        waited for in the rollout phase; then at once its acceptance (on the rows' own weights),
        the controller's move and the next step's draw."""
        if not self.produced:
            return self.draw(timer)
        with timer("rollout"):
            drawn = self.pipeline.result(step)
        sampled = drawn.sampled
        prompts, rollout = sampled.train.prompts, sampled.train.rollout
        with timer("monitor"):  # the rows against the dense policy of their own weights
            acceptance = self.monitor.measure_same_weights(
                step,
                [p.token_ids for p in prompts],
                rollout.batch,
                rollout.plan,
                drawn.same_weights,
                rollout.stats,
            )
        with timer("control"):  # this step's acceptance sets the next rollout's schedule
            control = self.steering.update(rollout.batch, acceptance.stats, rollout.stats)
            if self.staleness and step + 1 < self.cfg.rl.steps:  # none past the last
                self.pipeline.submit(step + 1)
        sampled.steered = (acceptance, control)
        versions = rollout.batch.weight_version
        assert versions is not None, "collated with the engine's weight version"
        sampled.metrics |= drawn.times | staleness_metrics(step, versions, self.ranks)
        return sampled

    def wait(self) -> None:
        """Until the draw in flight, if any, is done: the engine's weights never change under a
        generate."""
        self.pipeline.wait()

    def push(self, actor, version: int) -> dict[str, float]:
        """theta of `version` (`actor`: sparrow.rl.actor.DenseActor), or its LoRA adapter alone
        (actor.lora), into the rollout ranks' engines: the push's time and bytes; nothing
        without rollout ranks."""
        if not isinstance(self.pipeline, RemoteRollouts):
            return {}
        buckets = actor.weight_buckets(self.pipeline.bucket_bytes, self.pipeline.dtype)
        return self.pipeline.push(buckets, version)

    def close(self) -> None:
        """Let the producer go (the rollout ranks' loop ends with the trainers')."""
        self.pipeline.close()

    def plan_line(self) -> str:
        """The plan's line on rollout ranks; empty without them."""
        if self.roles is None:
            return ""
        r = self.roles.rollout_ranks
        return (
            f"\n  rollout ranks: {r} of {self.roles.world_size} (the last), draws "
            f"{'one step ahead' if self.staleness else 'in the step'}, weights pushed in "
            f"{self.cfg.cluster.push_bucket_mb:g} MiB buckets over {self.roles.push_backend}"
        )
