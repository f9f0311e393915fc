"""The run's state across launches: the step, the non-finite streak and the first evaluation's
scores, saved with the actor in every checkpoint together with the parts' own state (the prompt
order, the controller, the engine's sampling-call count (its seed stream), DistillSparse's
adapter) and the step's metrics row (restored from here if metrics.jsonl lost it).

`RunState` is given the parts it saves and loads; the trainer holds it and, after a resume, puts
the loaded weights into the engine itself (the run state does not call back into the trainer).
"""

from dataclasses import asdict
from pathlib import Path

from sparrow.train.run.checkpoint import CheckpointManager
from sparrow.train.run.host import record_host
from sparrow.train.run.stored_config import ResumeMismatch, check_resume, save_run_config


class RunState:
    """Save, pick and load the run's checkpoints.

    `cfg`: the run's config (run_dir, resume, resume_mismatch; stored whole in the run dir);
    `parts`: the objects whose state a checkpoint holds — `actor` (save_checkpoint,
    load_checkpoint), `prompts`, `steering` (its controller), `engine` (num_generate_calls),
    `distill` (or None), `baseline` (the first evaluation's scores), `logger` (the step's row,
    the history cut back on resume) and `pending_rollout` (or None: the asynchronous loop's
    rollout producer, whose finished draw of the next step is saved and handed back on resume:
    its prompts and sampling calls are already spent, so the resumed run trains those rows).
    """

    def __init__(
        self,
        cfg,
        ranks,
        *,
        actor,
        prompts,
        steering,
        engine,
        distill,
        baseline,
        logger,
        pending_rollout=None,
    ):
        self.cfg, self.ranks = cfg, ranks
        self.run_dir = Path(cfg.run_dir)
        self.checkpoints = CheckpointManager(self.run_dir / "checkpoints", cfg.rl.keep_last)
        self.actor, self.prompts, self.steering, self.engine = actor, prompts, steering, engine
        self.distill, self.baseline, self.logger = distill, baseline, logger
        self.pending_rollout = pending_rollout
        self.step = 0
        self.nonfinite_streak = 0

    def state_dict(self) -> dict:
        controller = self.steering.controller
        return {
            "prompts": self.prompts.state_dict(),
            "controller": None if controller is None else controller.state_dict(),
            "engine_generate_calls": self.engine.num_generate_calls,
            "nonfinite_streak": self.nonfinite_streak,
            "first_eval": self.baseline.scores,
            "distill": None if self.distill is None else self.distill.state_dict(),
            "metrics_row": self._step_row(),
            "pending_rollout": None
            if self.pending_rollout is None
            else self.pending_rollout.state_dict(),
        }

    def _step_row(self) -> dict | None:
        """This step's metrics row as logged (rank 0 logs; other ranks save no trainer state)."""
        row = self.logger.last_row
        return row if row is not None and row["step"] == self.step else None

    def save(self) -> Path:
        return self.checkpoints.save(self.step, self.state_dict(), self.actor.save_checkpoint)

    def resume(self) -> bool:
        """Resume from a checkpoint (resume=auto: the newest complete one) after checking that
        the run dir's stored config matches; cut the run history back to the resumed step; note
        the launch's host in host.json.
        True when a checkpoint was loaded (the engine then needs the loaded weights)."""
        config = asdict(self.cfg)
        # Rank 0 picks and checks the checkpoint for all: a rank on another node could see an
        # older listing of the shared run dir and load another step, and each rank would
        # otherwise checksum every checkpoint file again.
        path = self.ranks.from_rank0(lambda: self._checkpoint_to_resume(config))
        row = self._load(path) if path is not None else None
        self.logger.resume_at(self.step if path is not None else -1, row)
        if self.ranks.rank == 0:
            save_run_config(self.run_dir, config)
            record_host(self.run_dir, self.step if path is not None else 0)
        return path is not None

    def _checkpoint_to_resume(self, config: dict) -> Path | None:
        """The checkpoint `resume` names (auto: the newest complete one), checked against the
        run dir's stored config; None to start afresh."""
        resume = self.cfg.resume
        if resume == "never":
            return None
        path = self.checkpoints.latest_complete() if resume == "auto" else Path(resume)
        if path is not None:
            allow = self.cfg.resume_mismatch == "allow"
            defaults = asdict(type(self.cfg)())  # for keys newer than the run dir's config
            check_resume(self.run_dir, config, allow, path, defaults)
        return path

    def _load(self, path: Path) -> dict | None:
        """Load checkpoint `path` into the parts; returns the metrics row it carries."""
        loaded = self.checkpoints.load(path)
        try:
            self.actor.load_checkpoint(loaded.actor_dir)
        except RuntimeError as err:  # e.g. tensor shapes of another model
            raise ResumeMismatch(
                f"checkpoint {path} does not fit this model ({' '.join(str(err).split())[:200]}"
                "); use another run_dir or resume=never"
            ) from err
        state = loaded.state
        self.prompts.load_state_dict(state["prompts"])
        if self.steering.controller is not None and state["controller"] is not None:
            self.steering.controller.load_state_dict(state["controller"])
        self.engine.num_generate_calls = state["engine_generate_calls"]
        self.nonfinite_streak = state["nonfinite_streak"]
        self.baseline.scores = state.get("first_eval")
        self.step = loaded.step
        if self.pending_rollout is not None:
            self.pending_rollout.load_state_dict(state.get("pending_rollout"))
        if self.distill is not None:
            if state.get("distill") is not None:
                self.distill.load_state_dict(state["distill"])
            self.distill.load_base(self.actor.gathered_state_dict())
        if self.ranks.rank == 0:
            print(f"resumed from {path} at step {self.step}", flush=True)
        return state.get("metrics_row")
