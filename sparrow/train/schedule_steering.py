"""The sparse budget between steps: the controller's move from a step's per-bin acceptance, the
engine told the schedule that results, and what a step's rollouts read (the KV-read ratio and
the tokens decoded sparsely)."""

from sparrow.control.controller import make_controller
from sparrow.control.cost_model import engine_cost_config, predicted_speedup
from sparrow.control.kv_read import kv_pages, kv_read_ratio, sparse_tokens
from sparrow.distributed import Ranks
from sparrow.models.shape import ModelShape
from sparrow.rl.batch import RolloutBatch
from sparrow.train.config import SparrowConfig


class ScheduleSteering:
    """Owns the controller (None under schedule.mode=dense: the engine attends densely) and
    keeps the engine's schedule equal to the controller's. With speculative rollouts the
    controller holds its budgets (the rows' acceptance is not the drafts')."""

    def __init__(self, cfg: SparrowConfig, engine, shape: ModelShape, ranks: Ranks):
        self.controller = make_controller(cfg.schedule, cfg.controller)
        self.engine, self.shape, self.ranks = engine, shape, ranks
        self.tau = cfg.controller.tau
        # Speculative rollouts record the dense pass's rows: their acceptance is the noise floor,
        # not the drafts', and would walk every bin down to the smallest budget.
        self.holds = cfg.rollout.speculative.enabled
        self.page_size = cfg.rollout.engine.page_size
        eng = cfg.rollout.engine
        self.cost = engine_cost_config(eng.page_size, len(eng.dense_layers), eng.dtype)
        self.push()

    def push(self) -> None:
        """The controller's schedule into the engine (after a move, a resume or a dense eval)."""
        budget = None if self.controller is None else self.controller.schedule.budget_pages
        self.engine.set_schedule(budget)

    def update(self, batch: RolloutBatch, stats) -> dict:
        """The controller's move from this step's per-bin `stats`, and the cost model's
        predicted speedup for the schedule the batch was rolled out with."""
        if self.controller is None:
            return {}
        rolled_with = self.controller.schedule
        prompt_tokens = int(batch.prompt_lens.float().mean())
        output_tokens = max(1, int(batch.completion_mask.sum(1).float().mean()))
        metrics = {
            "controller/tau": self.tau,
            "speedup/predicted": predicted_speedup(
                self.shape, prompt_tokens, output_tokens, len(batch), rolled_with, self.cost
            ),
        }
        if not self.holds:
            self.controller.update(stats)
            self.push()
        for i, b in enumerate(self.controller.schedule.budgets_pages):
            metrics[f"schedule/budget_pages/bin{i}"] = b
        return metrics

    def kv_read(self, batch: RolloutBatch) -> dict:
        """Pages read by sparse layers over the pages a dense decode would read, and the tokens
        decoded sparsely (what DistillSparse learns from), all ranks."""
        read, dense = kv_pages(batch.budget_pages, batch.completion_mask, self.page_size)
        sparse = sparse_tokens(batch.budget_pages, batch.completion_mask, self.page_size)
        return {
            "kv_read_ratio": kv_read_ratio(self.ranks.sum(read), self.ranks.sum(dense)),
            "rollout/sparse_tokens": self.ranks.sum(sparse),
        }
