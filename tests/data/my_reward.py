"""A reward of a user's own, as `rl.reward.function` loads it (docs/guide/, "Your reward"):

    sparrow-train preset=tiny rl.reward.function=tests/data/my_reward.py:score
    sparrow-train preset=tiny rl.reward.function=tests/data/my_reward.py:score_all \
        rl.reward.batched=true +rl.reward.kwargs.wrong=0.1

A verifiable reward for the embedded arithmetic task ("What is 7 + 34? Answer with just the
number."): right when the completion's last integer is the reference. Plain Python, no import
of sparrow: a reward file needs none (returning sparrow.tasks.reward_result.RewardResult instead
of a float adds per-sample extras).
"""

import json
import re

_INTEGER = re.compile(r"-?\d+")


def score(prompt, completion, reference, wrong=0.0, log_path=None):
    """1.0 when the last integer in `completion` equals `reference`, else `wrong`. With
    `log_path`, each call appends {"completion", "reference", "score"} to that JSONL file (the
    tests read it to check that the trainer logged what this function returned)."""
    numbers = _INTEGER.findall(completion)
    value = 1.0 if numbers and numbers[-1] == reference.strip() else float(wrong)
    if log_path:
        with open(log_path, "a") as log:
            row = {"completion": completion, "reference": reference, "score": value}
            log.write(json.dumps(row) + "\n")
    return value


def score_all(prompts, completions, references, wrong=0.0, log_path=None):
    """The batched form (`rl.reward.batched=true`): one call per batch, one score each."""
    return [
        score(p, c, r, wrong, log_path)
        for p, c, r in zip(prompts, completions, references, strict=True)
    ]
