"""Held-out evaluation: accuracy (with a 95% interval) and mean completion length, and with
k samples per prompt pass@j and mean@k as peers report them.

Accuracy's interval is Wilson's, over the held-out prompts of all ranks; pass@j's and mean@k's,
whose per-prompt values lie in [0, 1], are the normal approximation over prompts with Wilson's
where every prompt has the same value (there the spread reads 0). `sum_over_ranks` reduces
counts across data-parallel ranks.
"""

import logging
import math
from collections.abc import Callable, Sequence

from sparrow.rollout.engine import LLMEngine, SamplingParams
from sparrow.tasks.data import Prompt
from sparrow.tasks.rewards import GuardedReward, RewardStats, score_batch

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


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021)'s unbiased pass@k of a prompt with `c` correct of `n` samples,
    1 - C(n-c, k) / C(n, k), as the product 1 - prod_{i=n-c+1..n} (1 - k / i) (the paper's own
    form): as floats the binomials overflow from n ~ 1030, and exact integers cost O(n) digits."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:  # every draw of k samples holds a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_ks(samples: int) -> list[int]:
    """The j of the pass@j logged for `samples` per prompt: 2, 4, 8, ... below it, and itself
    (pass@1 is mean@k for 0/1 rewards, logged as that)."""
    ks, j = [], 2
    while j < samples:
        ks.append(j)
        j *= 2
    return [*ks, samples] if samples > 1 else []


def mean_interval(total: float, total_sq: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """95% interval of the mean of n per-prompt values in [0, 1] (their sum and sum of squares):
    the normal approximation from their spread, Wilson's where they are all equal."""
    if n <= 1:
        return wilson_interval(total, n, z)
    mean = total / n
    var = max(total_sq - total * total / n, 0.0) / (n - 1)
    if var <= 1e-12:
        return wilson_interval(total, n, z)
    half = z * math.sqrt(var / n)
    return (max(mean - half, 0.0), min(mean + half, 1.0))


def sampled_metrics(
    engine: LLMEngine,
    reward: GuardedReward,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    samples: int,
    sum_over_ranks: Callable[[float], float] = float,
    seed: int | None = None,
    stats: RewardStats | None = None,
    episodes=None,
) -> dict:
    """`samples` completions per prompt at `params`: eval/mean@k (the mean score) and
    eval/pass@j for j in `pass_ks(k)` (a sample is correct with full marks, score >= 1), each
    with its 95% interval over the prompts of all ranks. `stats` adds up the reward's calls
    and failures. `episodes` (train/rollouts/episodes.py): each sample is a multi-turn episode,
    scored by its environment."""
    per_prompt: list[list[float]] = [[] for _ in prompts]
    if prompts:
        outputs, scored = _sample_and_score(
            engine, reward, prompts, params, samples, seed, episodes
        )
        scores = scored.scores.tolist()
        if stats is not None:
            stats.add(scored.stats)
        for o, score in zip(outputs, scores, strict=True):
            per_prompt[o.prompt_index].append(score)
    values = {f"mean@{samples}": [sum(s) / samples for s in per_prompt]}
    for j in pass_ks(samples):
        values[f"pass@{j}"] = [pass_at_k(samples, sum(x >= 1.0 for x in s), j) for s in per_prompt]
    n = sum_over_ranks(len(prompts))
    metrics: dict[str, float] = {}
    for name, vals in values.items():
        total = sum_over_ranks(sum(vals))
        lo, hi = mean_interval(total, sum_over_ranks(sum(v * v for v in vals)), n)
        metrics |= {
            f"eval/{name}": total / max(n, 1.0),
            f"eval/{name}_lo95": lo,
            f"eval/{name}_hi95": hi,
            f"eval/{name}_ci95": (hi - lo) / 2,
        }
    return metrics


def evaluate(
    engine: LLMEngine,
    reward: GuardedReward,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    sum_over_ranks: Callable[[float], float] = float,
    seed: int | None = None,
    num_samples: int = 3,
    samples: int = 1,
    sample_params: SamplingParams | None = None,
    episodes=None,
) -> tuple[dict, list[float]]:
    """One sample per held-out prompt; accuracy = mean reward (rewards are 0/1 here). `seed`:
    the sampling stream of this evaluation (None: the engine's own). `samples` > 1 adds
    pass@j and mean@k of that many completions per prompt at `sample_params` (`sampled_metrics`).

    Returns the metrics and this rank's per-prompt scores (for paired comparisons). The metrics
    carry `eval/samples`: this rank's first `num_samples` prompts (the tail of the prompt text),
    completions, reference answers and scores, for people reading the log; and where the
    reward failed on any rank, its counts (`reward_counts`). `episodes`: with env.function,
    each sample is a multi-turn episode (train/rollouts/episodes.py) scored by its environment
    (pass@k over episodes); None: single-turn completions scored by `reward`.
    """
    stats = RewardStats()
    if prompts:
        outputs, scored = _sample_and_score(engine, reward, prompts, params, 1, seed, episodes)
        scores = scored.scores
        stats.add(scored.stats)
        per_prompt = scores.tolist()
        rows = [
            {"prompt": p.text[-300:], "completion": o.text, "answer": p.answer, "score": score}
            for p, o, score in zip(prompts, outputs, per_prompt, strict=True)
        ][:num_samples]
        correct, lengths = float(scores.sum()), float(sum(len(o.token_ids) for o in outputs))
    else:
        per_prompt, correct, lengths, rows = [], 0.0, 0.0, []
    n = sum_over_ranks(len(prompts))
    correct = sum_over_ranks(correct)
    lengths = sum_over_ranks(lengths)
    lo, hi = wilson_interval(correct, n)
    accuracy = correct / max(n, 1.0)
    sampled = {}
    if samples > 1:
        assert sample_params is not None, "samples > 1 come with their sampling params"
        sampled = sampled_metrics(
            engine, reward, prompts, sample_params, samples, sum_over_ranks, seed, stats, episodes
        )
    return {
        "eval/accuracy": accuracy,
        "eval/accuracy_lo95": lo,
        "eval/accuracy_hi95": hi,
        "eval/accuracy_ci95": (hi - lo) / 2,
        "eval/n": n,
        "eval/len_mean": lengths / max(n, 1.0),
        "eval/samples": rows,
    } | sampled | reward_counts(stats, sum_over_ranks), per_prompt


def _sample_and_score(engine, reward, prompts, params, n: int, seed, episodes) -> tuple:
    """(n outputs per prompt, prompt-major; their BatchScores): completions scored by `reward`,
    or with `episodes` multi-turn episodes scored by their environments."""
    if episodes is not None:
        outputs = episodes.generate(prompts, params, n, seed=seed)
        return outputs, episodes.scores(outputs)
    outputs = engine.generate([p.token_ids for p in prompts], params, n=n, seed=seed)
    scored = score_batch(
        reward,
        [prompts[o.prompt_index].text for o in outputs],
        [o.text for o in outputs],
        [prompts[o.prompt_index].answer for o in outputs],
    )
    return outputs, scored


def reward_counts(stats: RewardStats, sum_over_ranks: Callable[[float], float]) -> dict:
    """eval/reward_calls, _errors and _timeouts over all ranks when any call failed, else {}:
    a failed call scores 0, which accuracy counts as a wrong answer. Only then, so that a
    clean evaluation logs the keys it always logged."""
    calls, errors, timeouts = (
        sum_over_ranks(v) for v in (stats.calls, stats.errors, stats.timeouts)
    )
    if not errors + timeouts:
        return {}
    return {
        "eval/reward_calls": calls,
        "eval/reward_errors": errors,
        "eval/reward_timeouts": timeouts,
    }


def eval_sampling(
    temperature: float, max_tokens: int, samples: int
) -> tuple[SamplingParams, SamplingParams | None]:
    """The sampling of the accuracy pass and of the k-sample pass (None with one sample): with
    one sample, accuracy at `temperature` (0, greedy, by default) as it always was; with k > 1,
    greedy accuracy beside k samples at `temperature`."""
    at_temperature = SamplingParams(temperature=temperature, max_tokens=max_tokens)
    if samples <= 1:
        return at_temperature, None
    return SamplingParams(temperature=0.0, max_tokens=max_tokens), at_temperature


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
