"""Held-out evaluation: accuracy (with a 95% interval) and mean completion length.

The interval is the normal approximation with a Wilson fallback at the extremes, over the
held-out prompts of all ranks; `sum_over_ranks` reduces counts across data-parallel ranks.
"""

import logging
import math
from collections.abc import Callable, Sequence

from sparrow.rollout.engine import LLMEngine, SamplingParams
from sparrow.tasks.data import Prompt
from sparrow.tasks.rewards import GuardedReward, score_batch

log = logging.getLogger(__name__)


def wilson_interval(successes: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (sane at 0 and n)."""
    if n <= 0:
        return (math.nan, math.nan)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (centre - half, centre + half)


def evaluate(
    engine: LLMEngine,
    reward: GuardedReward,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    sum_over_ranks: Callable[[float], float] = float,
    seed: int | None = None,
    num_samples: int = 3,
) -> tuple[dict, list[float]]:
    """One sample per held-out prompt; accuracy = mean reward (rewards are 0/1 here). `seed`:
    the sampling stream of this evaluation (None: the engine's own).

    Returns the metrics and this rank's per-prompt scores (for paired comparisons). The metrics
    carry `eval/samples`: this rank's first `num_samples` prompts (the tail of the prompt text),
    completions, reference answers and scores, for people reading the log.
    """
    if prompts:
        outputs = engine.generate([p.token_ids for p in prompts], params, n=1, seed=seed)
        scores = score_batch(
            reward,
            [p.text for p in prompts],
            [o.text for o in outputs],
            [p.answer for p in prompts],
        ).scores
        per_prompt = scores.tolist()
        samples = [
            {"prompt": p.text[-300:], "completion": o.text, "answer": p.answer, "score": score}
            for p, o, score in zip(prompts, outputs, per_prompt, strict=True)
        ][:num_samples]
        correct, lengths = float(scores.sum()), float(sum(len(o.token_ids) for o in outputs))
    else:
        per_prompt, correct, lengths, samples = [], 0.0, 0.0, []
    n = sum_over_ranks(len(prompts))
    correct = sum_over_ranks(correct)
    lengths = sum_over_ranks(lengths)
    lo, hi = wilson_interval(correct, n)
    accuracy = correct / max(n, 1.0)
    return {
        "eval/accuracy": accuracy,
        "eval/accuracy_lo95": lo,
        "eval/accuracy_hi95": hi,
        "eval/accuracy_ci95": (hi - lo) / 2,
        "eval/n": n,
        "eval/len_mean": lengths / max(n, 1.0),
        "eval/samples": samples,
    }, per_prompt


def paired_difference(after: list[float], before: list[float], z: float = 1.96) -> dict:
    """Mean of after - before over the same prompts, with a normal-approximation 95% CI."""
    if len(after) != len(before) or not after:
        raise ValueError(
            f"paired difference needs equal, non-empty lists ({len(after)}, {len(before)})"
        )
    diffs = [a - b for a, b in zip(after, before, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / max(n - 1, 1)
    half = z * math.sqrt(var / n)
    return {"eval/delta": mean, "eval/delta_lo95": mean - half, "eval/delta_hi95": mean + half}


class PairedBaseline:
    """The first evaluation's per-prompt scores, and each later evaluation's paired change."""

    def __init__(self):
        self.scores: list[float] | None = None  # saved in checkpoints (the run state)

    def delta(self, correct: list[float]) -> dict:
        """Accuracy now minus at the first evaluation, on the same prompts, with a paired 95% CI.

        `correct`: every rank's per-prompt scores in prompt order, the same list on every rank
        (a rank's own share may be empty, and the checkpoint holds rank 0's copy).
        """
        if not correct:
            return {}
        if self.scores is not None and len(self.scores) != len(correct):
            # A resumed run may change rl.eval.num_prompts: pairs no longer line up.
            log.warning("evaluation prompts changed: this evaluation is the new baseline")
            self.scores = None
        if self.scores is None:
            self.scores = correct
            return {}
        return paired_difference(correct, self.scores)
