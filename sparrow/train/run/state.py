"""The GRPO trainer's run state, saved with the actor in every checkpoint and restored on
resume: the prompt order, the controller, the engine's sampling-call count (its seed stream), the
non-finite streak, the first evaluation's scores, DistillSparse's adapter, and the step's own
metrics row (restored from here if metrics.jsonl lost it).

`CheckpointedRun` is GRPOTrainer's base: it reads and writes the trainer's parts (`prompts`,
`steering`, `engine`, `actor`, `distill`, `baseline`, `checkpoints`, `logger`, `ranks`) and
calls back `_sync_engine` and `steering.push` after loading.
"""

from dataclasses import asdict
from pathlib import Path

from sparrow.train.run.stored_config import ResumeMismatch, check_resume, save_run_config


class CheckpointedRun:
    """Save, pick and load the trainer's checkpoints (a mixin: the state is GRPOTrainer's)."""

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
        }

    def _step_row(self) -> dict | None:
        """This step's metrics row as logged (rank 0 logs; other ranks save no trainer state)."""
        row = self.logger.last_row
        return row if row is not None and row["step"] == self.step else None

    def save(self) -> Path:
        return self.checkpoints.save(self.step, self.state_dict(), self.actor.save_checkpoint)

    def _maybe_resume(self) -> None:
        """Resume from a checkpoint (resume=auto: the newest complete one) after checking that
        the run dir's stored config matches; cut the run history back to the resumed step."""
        config = asdict(self.cfg)
        # Rank 0 picks and checks the checkpoint for all: a rank on another node could see an
        # older listing of the shared run dir and load another step, and each rank would
        # otherwise checksum every checkpoint file again.
        path = self.ranks.from_rank0(lambda: self._checkpoint_to_resume(config))
        row = self._load_checkpoint(path) if path is not None else None
        self.logger.resume_at(self.step if path is not None else -1, row)
        if self.rank == 0:
            save_run_config(self.run_dir, config)

    def _checkpoint_to_resume(self, config: dict) -> Path | None:
        """The checkpoint `resume` names (auto: the newest complete one), checked against the
        run dir's stored config; None to start afresh."""
        resume = self.cfg.resume
        if resume == "never":
            return None
        path = self.checkpoints.latest_complete() if resume == "auto" else Path(resume)
        if path is not None:
            check_resume(self.run_dir, config, self.cfg.resume_mismatch == "allow", path)
        return path

    def _load_checkpoint(self, path: Path) -> dict | None:
        """Load checkpoint `path` into the trainer; returns the metrics row it carries."""
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
        if self.distill is not None:
            if state.get("distill") is not None:
                self.distill.load_state_dict(state["distill"])
            self.distill.load_base(self.actor.gathered_state_dict())
        self._sync_engine()
        self.steering.push()
        if self.rank == 0:
            print(f"resumed from {path} at step {self.step}", flush=True)
        return state.get("metrics_row")
