"""One GRPO/TIS update of theta on a step's batch: the loss mask (rows left out by overlong
filtering and by the rollout correction's rejection), the no-signal skip, the step's counts for
the seq_* aggregations, the frozen reference's log-probs in the actor's micro-batches, and the
metrics reduced over ranks.

Where the step's dense log-probs come from (`dense_pass`, rl.dense_pass): a step's batch feeds
exactly one optimizer step, so the dense policy before the update *is* the policy of the
update's forward. With "update" that forward's scores, detached, are the old log-probs (the PPO
ratio is then exactly 1, as TRL takes them when a batch is used once), the rollout correction's
numerator, and, handed back, the monitor's and DistillSparse's dense log-probs, top-K, entropy
and exact acceptance: one dense forward per step instead of two. A separate no-grad pass before
the update remains where something reads them before the loss (seq_mask's rejection) or where
no update runs (see `dense_pass`).
"""

import logging
from dataclasses import dataclass

from torch import Tensor

from sparrow.distributed import Ranks
from sparrow.rl.batch import RolloutBatch
from sparrow.rl.losses import METRIC_REDUCTIONS, PolicyLoss, StepCounts
from sparrow.rl.policy_logprobs import ForwardScores, LogprobOutput, RowLogits
from sparrow.rl.reference import ReferencePolicy
from sparrow.rl.rollout_correction import REJECTING_MODES, make_rejection
from sparrow.train.config import SparrowConfig

log = logging.getLogger(__name__)


def dense_pass(cfg: SparrowConfig) -> tuple[str, str]:
    """(the pass the run uses, "update" or "separate"; why, for the plan line): rl.dense_pass,
    except that "update" falls back to "separate" when a reader needs the dense log-probs before
    the loss or no update forward ever runs."""
    rl = cfg.rl
    if rl.dense_pass == "separate":
        return "separate", "a separate no-grad pass before the update (rl.dense_pass=separate)"
    if rl.correction.mode in REJECTING_MODES:
        why = f"rl.correction.mode={rl.correction.mode} rejects rows by them before the loss"
        return "separate", f"a separate pass before the update ({why})"
    if not rl.update_policy:
        return "separate", "a separate pass (rl.update_policy=false: no update forward)"
    return "update", (
        "the update's forward (one dense forward per step; a separate pass on steps whose "
        "update is skipped for want of signal)"
    )


@dataclass
class UpdateOutcome:
    """The update's metrics and whether theta's optimizer stepped (not frozen, not skipped for
    want of signal): only then does a non-finite update count towards a streak. `dense` and
    `exact`: what the update's forward scored, detached, when it was asked to (no `dense` in):
    the batch's LogprobOutput and (B, T) exact acceptance of the rows given rollout logits."""

    metrics: dict
    ran: bool
    dense: LogprobOutput | None = None
    exact: Tensor | None = None


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
        dense: LogprobOutput | None,
        token_advantages,
        num_tokens: float,
        masked_rows=None,
        step: int = 0,
        rollout_logits: RowLogits | None = None,
    ) -> UpdateOutcome:
        """Ratios against `dense`, a pass before the update, or, when None, the update's own
        forward, whose scores come back in the outcome (with the exact acceptance of the rows
        `rollout_logits` gives); `masked_rows` (B,) bool: completions the loss leaves out
        (rl.overlong.mask_truncated); `step`: the 0-based index of the step, for the log."""
        cfg, ranks, actor = self.cfg, self.ranks, self.actor
        if not cfg.rl.update_policy:
            return UpdateOutcome({"policy_frozen": 1.0}, ran=False)
        loss_mask, token_advantages, num_tokens, rejected_frac = self._loss_mask(
            batch, dense, token_advantages, num_tokens, masked_rows
        )
        if cfg.rl.skip_no_signal and ranks.sum(token_advantages.ne(0).sum()) == 0:
            log.info("step %d: every advantage is zero, update skipped", step + 1)
            return UpdateOutcome({"no_signal": 1.0, "lr": actor.lr}, ran=False)
        train_batch = self._train_batch(batch, dense, loss_mask, token_advantages, rollout_logits)
        # Without a separate pass the forward keeps its scores (the exact rows measured too).
        keep = None if dense is not None else ForwardScores(cfg.rollout.engine.topk_logprobs)
        extremes: dict[str, list[float]] = {}  # min/max metrics: the actor only sums
        counts = self._step_counts(loss_mask, num_tokens)
        temperature = cfg.rollout.temperature

        def micro_batch_loss(logprobs, mb):
            ref = None
            if self.reference is not None:  # in the actor's micro-batches, without grad
                ref = self.reference.token_logprobs(mb, temperature)
            # One update per batch: the policy before it is this forward's, so old = new
            # detached (ratio exactly 1) unless a separate pass gave them.
            old = mb["old_logprobs"] if "old_logprobs" in mb else logprobs.detach()
            loss, metrics = self.loss_fn(
                logprobs,
                old,
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

        micro_batches = actor.micro_batches(train_batch)
        update = actor.train_step(micro_batches, micro_batch_loss, temperature, keep=keep)
        update |= {k: ranks.extreme(v, METRIC_REDUCTIONS[k]) for k, v in extremes.items()}
        if rejected_frac is not None:  # the loss saw the mask without them
            update["correction/masked_frac"] = rejected_frac
        outcome = UpdateOutcome(update | {"no_signal": 0.0}, ran=True)
        if keep is not None:
            outcome.dense, outcome.exact = keep.output(batch.input_ids.device)
        return outcome

    @staticmethod
    def _train_batch(batch: RolloutBatch, dense, loss_mask, token_advantages, rollout_logits):
        """The actor's input rows: with `dense`, its log-probs as the old ones; else, with
        `rollout_logits`, the exact rows' rollout logits (a list) for the head to measure."""
        train_batch = {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "completion_mask": loss_mask,
            "rollout_logprobs": batch.drawn_logprobs,  # truncated when top-p/top-k drew them
            "advantages": token_advantages,
            "prompt_lens": batch.prompt_lens,  # the group structure, for the shared prompt pass
            "group_ids": batch.group_ids,
        }
        if dense is not None:
            train_batch["old_logprobs"] = dense.token_logprobs
        elif rollout_logits is not None:
            train_batch["rollout_logits"] = rollout_logits
        return train_batch

    def _loss_mask(self, batch: RolloutBatch, dense: LogprobOutput | None, token_advantages,
                   num_tokens, masked_rows) -> tuple:  # fmt: skip
        """(loss mask, token advantages, token count, rejected share or None): the completion
        mask less `masked_rows` and, under seq_mask, the rows the rejection drops; a cut mask
        zeroes their advantages and recounts the step's tokens over ranks."""
        ranks = self.ranks
        loss_mask = batch.completion_mask
        if masked_rows is not None:  # out of the loss and of its token count
            loss_mask = loss_mask & ~masked_rows[:, None]
        rejected_frac = None
        if self.rejection is not None:  # seq_mask: as verl, rejected rows leave the mask and counts
            assert dense is not None, "seq_mask's rejection reads a separate pass (dense_pass)"
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
