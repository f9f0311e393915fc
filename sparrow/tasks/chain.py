"""The long-generation task: a chain of additions and subtractions, worked out one line per step.

    Start with 47. Then, in this order: add 18, subtract 5, add 33, ... Work it out step by
    step: write one line per operation in the form 'a + b = c' or 'a - b = c', then finish with
    'Answer: ' and the final number.

    47 + 18 = 65
    65 - 5 = 60
    ...
    Answer: 392

The working is the point. A 30-step chain is ~370 completion tokens, and every line reads its
operation from the question far back in the context: the regime of long chains of thought, where
nearly every token is decoded sparsely and the page selection decides what the model can see
(the DistillSparse study, docs/distill/). Solved chains before the question (`few_shot`, earlier
chat turns, the same for every prompt) teach the format and make the prompt long.

Values stay whole numbers in [0, 999]: operands are two-digit, a subtraction is drawn only when
it stays >= 0, an addition only when it stays <= 999.

Reward `chain` (registered in rewards.py): verifiable with partial credit, so that GRPO groups
have reward variance on a small model. The steps and the final answer line are n + 1 items; the
score is the share of them written correctly in order, counting from the first until the first
wrong one (a slip at step k scores (k - 1) / (n + 1)); the answer line counts only after all n
steps are right. The chain is recomputed from the question in the prompt, so the reward needs no
metadata; the reference (the final value) must agree with it.
"""

import random
import re

from sparrow.tasks.reward_result import RewardResult

_QUESTION = re.compile(
    r"Start with (\d+)\. Then, in this order: ((?:(?:add|subtract) \d+(?:, )?)+)\."
)
_OPERATION = re.compile(r"(add|subtract) (\d+)")
_LINE = re.compile(r"(-?\d+)\s*([+-])\s*(\d+)\s*=\s*(-?\d+)")
_ANSWER = re.compile(r"Answer:\s*(-?\d+)")
MAX_VALUE = 999

Step = tuple[int, str, int, int]  # (value before, "+" or "-", operand, value after)


def draw_chain(rng: random.Random, num_steps: int) -> tuple[int, list[Step]]:
    """A start value and `num_steps` steps, every value in [0, MAX_VALUE]."""
    start = value = rng.randint(10, 99)
    steps = []
    for _ in range(num_steps):
        operand = rng.randint(10, 99)
        can_add, can_subtract = value + operand <= MAX_VALUE, value - operand >= 0
        subtract = can_subtract and (not can_add or rng.random() < 0.5)
        after = value - operand if subtract else value + operand
        steps.append((value, "-" if subtract else "+", operand, after))
        value = after
    return start, steps


def chain_question(start: int, steps: list[Step]) -> str:
    operations = ", ".join(
        f"{'subtract' if op == '-' else 'add'} {operand}" for _, op, operand, _ in steps
    )
    return (
        f"Start with {start}. Then, in this order: {operations}. Work it out step by step: write "
        "one line per operation in the form 'a + b = c' or 'a - b = c', then finish with "
        "'Answer: ' and the final number."
    )


def chain_working(steps: list[Step]) -> str:
    """The solved working: one line per step, then the answer line."""
    lines = [f"{a} {op} {b} = {c}" for a, op, b, c in steps]
    return "\n".join([*lines, f"Answer: {steps[-1][3]}"])


def chain_example(num_steps: int, rng: random.Random) -> dict:
    """One example in the generator's format (prompt, answer, task, metadata)."""
    start, steps = draw_chain(rng, num_steps)
    return {
        "prompt": chain_question(start, steps),
        "answer": str(steps[-1][3]),
        "task": "chain",
        "metadata": {"start": start, "steps": [list(s) for s in steps]},
    }


def parse_question(prompt: str) -> tuple[int, list[Step]]:
    """The chain of the last question in `prompt` (a chat-templated prompt holds the solved
    examples' questions first), recomputed step by step."""
    questions = _QUESTION.findall(prompt)
    if not questions:
        raise ValueError("no chain question ('Start with N. Then, in this order: ...') in prompt")
    start, operations = questions[-1]
    value, steps = int(start), []
    for word, operand in _OPERATION.findall(operations):
        op, b = ("-" if word == "subtract" else "+"), int(operand)
        after = value - b if op == "-" else value + b
        steps.append((value, op, b, after))
        value = after
    return int(start), steps


def chain_reward(prompt: str, completion: str, reference: str) -> RewardResult:
    """Share of the n steps and the answer line written correctly in order (module docstring)."""
    _, steps = parse_question(prompt)
    if str(steps[-1][3]) != reference.strip():
        raise ValueError(f"reference {reference!r} is not the chain's result {steps[-1][3]}")
    written = [(int(a), op, int(b), int(c)) for a, op, b, c in _LINE.findall(completion)]
    correct = 0
    for line, step in zip(written, steps, strict=False):
        if line != step:
            break
        correct += 1
    answers = _ANSWER.findall(completion)
    answered = correct == len(steps) and bool(answers) and int(answers[-1]) == steps[-1][3]
    score = (correct + answered) / (len(steps) + 1)
    return RewardResult(score, {"steps_correct": float(correct), "answered": float(answered)})
