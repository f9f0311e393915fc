"""One GRPO/TIS update of theta on a step's batch: the loss mask (rows left out by overlong
filtering and by the rollout correction's rejection), the no-signal skip, the step's counts for
the seq_* aggregations, the frozen reference's log-probs in the actor's micro-batches, and the
metrics reduced over ranks."""

import logging
from dataclasses import dataclass

from sparrow.distributed import Ranks
from sparrow.rl.batch import RolloutBatch
from sparrow.rl.losses import METRIC_REDUCTIONS, PolicyLoss, StepCounts
from sparrow.rl.policy_logprobs import LogprobOutput
from sparrow.rl.reference import ReferencePolicy
from sparrow.rl.rollout_correction import make_rejection
from sparrow.train.config import SparrowConfig

log = logging.getLogger(__name__)


@dataclass
class UpdateOutcome:
    """The update's metrics and whether theta's optimizer stepped (not frozen, not skipped for
    want of signal): only then does a non-finite update count towards a streak."""

    metrics: dict
    ran: bool


class PolicyUpdate:
    """The update's fixed parts (the actor, loss, frozen reference, ranks, config); called once
    a step with that step's batch."""

    def __init__(
        self,
        actor,
        loss_fn: PolicyLoss,
        reference: ReferencePolicy | None,
        ranks: Ranks,
        cfg: SparrowConfig,
    ):
        self.actor, self.loss_fn, self.reference = actor, loss_fn, reference
        self.ranks, self.cfg = ranks, cfg
        self.rejection = make_rejection(cfg.rl.correction)  # None unless rl.correction rejects

    def __call__(
        self,
        batch: RolloutBatch,
        dense: LogprobOutput,
        token_advantages,
        num_tokens: float,
        masked_rows=None,
        step: int = 0,
    ) -> UpdateOutcome:
        """Ratios are taken against the dense log-probs `dense` taken before the update;
        `masked_rows` (B,) bool: completions the loss leaves out (rl.overlong.mask_truncated);
        `step`: the 0-based index of the step, for the log."""
        cfg, ranks, actor = self.cfg, self.ranks, self.actor
        if not cfg.rl.update_policy:
            return UpdateOutcome({"policy_frozen": 1.0}, ran=False)
        loss_mask, token_advantages, num_tokens, rejected_frac = self._loss_mask(
            batch, dense, token_advantages, num_tokens, masked_rows
        )
        if cfg.rl.skip_no_signal and ranks.sum(token_advantages.ne(0).sum()) == 0:
            log.info("step %d: every advantage is zero, update skipped", step + 1)
            return UpdateOutcome({"no_signal": 1.0, "lr": actor.lr}, ran=False)
        train_batch = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "completion_mask": loss_mask,
            "old_logprobs": dense.token_logprobs,
            "rollout_logprobs": batch.drawn_logprobs,  # truncated when top-p/top-k drew them
            "advantages": token_advantages,
            "prompt_lens": batch.prompt_lens,  # the group structure, for the shared prompt pass
            "group_ids": batch.group_ids,
        }
        extremes: dict[str, list[float]] = {}  # min/max metrics: the actor only sums
        counts = self._step_counts(loss_mask, num_tokens)
        temperature = cfg.rollout.temperature

        def micro_batch_loss(logprobs, mb):
            ref = None
            if self.reference is not None:  # in the actor's micro-batches, without grad
                ref = self.reference.token_logprobs(mb, temperature)
            loss, metrics = self.loss_fn(
                logprobs,
                mb["old_logprobs"],
                mb["rollout_logprobs"],
                mb["advantages"],
                mb["completion_mask"],
                num_tokens,
                ref_logprobs=ref,
                step=counts,
            )
            for key in [k for k in metrics if METRIC_REDUCTIONS.get(k) in ("min", "max")]:
                extremes.setdefault(key, []).append(float(metrics.pop(key)))
            return loss, metrics

        update = actor.train_step(actor.micro_batches(train_batch), micro_batch_loss, temperature)
        update |= {k: ranks.extreme(v, METRIC_REDUCTIONS[k]) for k, v in extremes.items()}
        if rejected_frac is not None:  # the loss saw the mask without them
            update["correction/masked_frac"] = rejected_frac
        return UpdateOutcome(update | {"no_signal": 0.0}, ran=True)

    def _loss_mask(self, batch: RolloutBatch, dense: LogprobOutput, token_advantages, num_tokens,
                   masked_rows) -> tuple:  # fmt: skip
        """(loss mask, token advantages, token count, rejected share or None): the completion
        mask less `masked_rows` and, under seq_mask, the rows the rejection drops; a cut mask
        zeroes their advantages and recounts the step's tokens over ranks."""
        ranks = self.ranks
        loss_mask = batch.completion_mask
        if masked_rows is not None:  # out of the loss and of its token count
            loss_mask = loss_mask & ~masked_rows[:, None]
        rejected_frac = None
        if self.rejection is not None:  # seq_mask: as verl, rejected rows leave the mask and counts
            rejected = self.rejection(dense.token_logprobs, batch.drawn_logprobs, loss_mask)
            totals = ranks.sums({"rejected": float(rejected.sum()), "all": float(loss_mask.sum())})
            rejected_frac = totals["rejected"] / max(totals["all"], 1.0)
            loss_mask = loss_mask & ~rejected
        if masked_rows is not None or rejected_frac is not None:
            token_advantages = token_advantages * loss_mask
            num_tokens = max(ranks.sum(loss_mask.sum()), 1.0)  # all cut: a zero loss
        return loss_mask, token_advantages, num_tokens, rejected_frac

    def _step_counts(self, loss_mask, num_tokens: float) -> StepCounts | None:
        """The seq_* aggregations' denominators over ranks (None under token_mean)."""
        cfg = self.cfg
        if cfg.rl.loss.aggregation == "token_mean":
            return None
        sequences = max(self.ranks.sum(loss_mask.any(-1).sum()), 1.0)  # rows left in the loss
        return StepCounts(num_tokens, sequences, cfg.rollout.max_new_tokens)
