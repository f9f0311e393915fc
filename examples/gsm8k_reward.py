"""A reward of your own for GSM8K-shaped data (docs/guide/your-model-data-reward.md):

    sparrow-train preset=tiny data=jsonl data.source=examples/gsm8k_mini.jsonl \
        data.prompt_column=question data.answer_extractor=gsm8k \
        rl.reward.function=examples/gsm8k_reward.py:score

`data.answer_extractor=gsm8k` hands the reward the number after the answer's last "####"; this
function gives full marks when the completion's last number equals it ("1,000" and "1000.0"
count as 1000), and `partial` when the completion has a number but another one. Plain Python:
a reward file imports nothing of sparrow.
"""

import re

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _value(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def score(prompt, completion, reference, partial=0.0):
    """1.0 when the last number of `completion` equals `reference`, `partial` when it holds a
    different number, 0.0 when it holds none."""
    numbers = _NUMBER.findall(completion)
    if not numbers:
        return 0.0
    expected = _value(reference.strip())
    return 1.0 if expected is not None and _value(numbers[-1]) == expected else float(partial)
