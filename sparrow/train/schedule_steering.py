"""The sparse budget between steps: the controller's move from a step's per-bin acceptance, the
engine told the schedule (and with speculative rollouts the k) that results, and what a step's
rollouts read (the KV-read ratio and the tokens decoded sparsely)."""

from sparrow.control.controller import (
    FixedController,
    OnlineController,
    make_controller,
    resolve_objective,
)
from sparrow.control.cost_model import (
    engine_cost_config,
    expected_tokens_per_round,
    predicted_speculative_speedup,
    predicted_speedup,
    speculative_tokens_per_eflop,
)
from sparrow.control.kv_read import (
    kv_pages,
    kv_pages_by_turn,
    kv_read_ratio,
    sparse_tokens,
    turn_index,
)
from sparrow.control.schedule import BudgetSchedule
from sparrow.control.throughput import BudgetBinStats, ThroughputController
from sparrow.distributed import Ranks
from sparrow.models.shape import ModelShape
from sparrow.monitor.draft_acceptance import draft_acceptance
from sparrow.rl.batch import RolloutBatch
from sparrow.train.config import SparrowConfig


class ScheduleSteering:
    """Owns the controller (None under schedule.mode=dense: the engine attends densely) and
    keeps the engine's schedule equal to the controller's. With speculative rollouts the
    objective is throughput (a ThroughputController on the drafts' acceptance, which also
    chooses k) or tail, under which the controller holds its budgets (the rows' acceptance is
    the noise floor there, not the drafts')."""

    def __init__(self, cfg: SparrowConfig, engine, shape: ModelShape, ranks: Ranks):
        self.controller: FixedController | OnlineController | ThroughputController | None = (
            make_controller(cfg.schedule, cfg.controller)
        )
        self.engine, self.shape, self.ranks = engine, shape, ranks
        self.tau = cfg.controller.tau
        spec = cfg.rollout.speculative
        self.speculative = spec.enabled
        objective = resolve_objective(cfg.controller.objective, spec.enabled)
        # Speculative rollouts record the dense pass's rows: their acceptance is the noise floor,
        # not the drafts', and would walk every bin down to the smallest budget.
        self.holds = spec.enabled and objective == "tail"
        self.page_size = cfg.rollout.engine.page_size
        # Multi-turn episodes: the KV-read ratio of each assistant turn too (a fixed set of keys,
        # so that every rank sums the same ones).
        self.max_turns = cfg.env.max_turns if cfg.env.function else 0
        self.bin_tokens = cfg.schedule.bin_tokens
        eng = cfg.rollout.engine
        self.cost = engine_cost_config(eng.page_size, len(eng.dense_layers), eng.dtype)
        self.max_batch = eng.max_batch_size
        self.decode_batch = eng.max_batch_size  # the step's decode batch, once a step is seen
        if self.controller is not None and objective == "throughput":
            self.controller = ThroughputController(
                self.controller.schedule,
                cfg.controller,
                self.tokens_per_eflop,
                spec.draft_tokens,
                move_budgets=cfg.schedule.mode == "online",
            )
        self.push()

    def tokens_per_eflop(self, bin_index: int, budget_pages: int, acceptance: float, k: int):
        """The cost model's expected speculative throughput at the middle of `bin_index` with
        drafts at `budget_pages` (the throughput controller's rate)."""
        context = int((bin_index + 0.5) * self.bin_tokens)
        schedule = BudgetSchedule(self.bin_tokens, (budget_pages,), (budget_pages,))
        return speculative_tokens_per_eflop(
            self.shape, context, k, self.decode_batch, schedule, acceptance, self.cost
        )

    def push(self) -> None:
        """The controller's schedule (and k) into the engine (after a move, a resume or a
        dense eval)."""
        budget = None if self.controller is None else self.controller.schedule.budget_pages
        self.engine.set_schedule(budget)
        if isinstance(self.controller, ThroughputController):
            self.engine.set_draft_tokens(self.controller.draft_tokens)

    def update(self, batch: RolloutBatch, stats, rollout_stats=None) -> dict:
        """The controller's move from this step's per-bin `stats` (speculative: the drafts'
        acceptance in `rollout_stats`, the engine's GenerateStats of the batch), and the cost
        model's predicted speedup for the schedule the batch was rolled out with."""
        metrics: dict[str, float] = {}
        drafts: list[BudgetBinStats] = []
        if self.speculative and rollout_stats is not None:
            metrics, drafts = draft_acceptance(rollout_stats, self.bin_tokens, self.ranks)
        if self.controller is None:
            return metrics
        rolled_with = self.controller.schedule
        prompt_tokens = int(batch.prompt_lens.float().mean())
        output_tokens = max(1, int(batch.completion_mask.sum(1).float().mean()))
        self.decode_batch = max(1, min(len(batch), self.max_batch))
        metrics["controller/tau"] = self.tau
        if self.speculative and "spec/accept/mean" in metrics:
            metrics |= self._speculative_prediction(
                metrics, prompt_tokens, output_tokens, rolled_with
            )
        elif not self.speculative:
            metrics["speedup/predicted"] = predicted_speedup(
                self.shape, prompt_tokens, output_tokens, len(batch), rolled_with, self.cost
            )
        if isinstance(self.controller, ThroughputController):
            self.controller.update(drafts)
            self.push()
        elif not self.holds:
            self.controller.update(stats)
            self.push()
        for i, b in enumerate(self.controller.schedule.budgets_pages):
            metrics[f"schedule/budget_pages/bin{i}"] = b
        return metrics

    def _speculative_prediction(
        self, metrics: dict, prompt_tokens: int, output_tokens: int, rolled_with
    ) -> dict:
        """The cost model's speedup over dense decode and tokens per verify pass, for the k the
        batch was drafted with and each bin's measured mean acceptance (a bin without drafts:
        the step's mean), beside the measured ones (spec/tokens_per_verify, speedup/measured)."""
        k = self.engine.speculative.draft_tokens  # not yet moved: the batch's k
        mean = metrics["spec/accept/mean"]

        def acceptance(context_tokens: int) -> float:
            return metrics.get(f"spec/accept/bin{context_tokens // self.bin_tokens}/mean", mean)

        bins = [
            k.split("/")[2]
            for k in metrics
            if k.startswith("spec/accept/bin") and k.endswith("/count")
        ]
        counts = {b: metrics[f"spec/accept/{b}/count"] for b in bins}
        per_round = sum(
            n * expected_tokens_per_round(min(1.0, metrics[f"spec/accept/{b}/mean"]), k)
            for b, n in counts.items()
        ) / sum(counts.values())
        speedup = predicted_speculative_speedup(
            self.shape, prompt_tokens, output_tokens, self.decode_batch, rolled_with, k,
            lambda t: min(1.0, acceptance(t)), self.cost,
        )  # fmt: skip
        return {
            "spec/draft_tokens": k,
            "spec/tokens_per_verify/predicted": per_round,
            "speedup/predicted": speedup,
        }

    def kv_read(self, batch: RolloutBatch) -> dict:
        """Pages read by sparse layers over the pages a dense decode would read, and the tokens
        decoded sparsely (what DistillSparse learns from), all ranks."""
        read, dense = kv_pages(batch.budget_pages, batch.completion_mask, self.page_size)
        sparse = sparse_tokens(batch.budget_pages, batch.completion_mask, self.page_size)
        metrics = {
            "kv_read_ratio": kv_read_ratio(self.ranks.sum(read), self.ranks.sum(dense)),
            "rollout/sparse_tokens": self.ranks.sum(sparse),
        }
        return metrics | self.kv_read_by_turn(batch)

    def kv_read_by_turn(self, batch: RolloutBatch) -> dict:
        """kv_read_ratio/turn<k> over the assistant turns k = 1..env.max_turns that any rank's
        episodes reached (all ranks); {} without multi-turn episodes."""
        if not self.max_turns:
            return {}
        turns = turn_index(batch.attention_mask, batch.completion_mask, batch.prompt_lens)
        by_turn = kv_pages_by_turn(batch.budget_pages, batch.completion_mask, turns, self.page_size)
        pages = {}
        for t in range(1, self.max_turns + 1):
            pages[f"read{t}"], pages[f"dense{t}"] = by_turn.get(t, (0.0, 0.0))
        pages = self.ranks.sums(pages)
        return {
            f"kv_read_ratio/turn{t}": kv_read_ratio(pages[f"read{t}"], pages[f"dense{t}"])
            for t in range(1, self.max_turns + 1)
            if pages[f"dense{t}"] > 0
        }
