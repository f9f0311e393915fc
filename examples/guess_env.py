"""An environment of your own (docs/guide/multi_turn.md): answer, hear "higher" or "lower", retry.

    sparrow-train preset=tiny env.function=examples/guess_env.py:make_env

Built per prompt row of the default arithmetic task ("What is 7 + 34? Answer with just the
number."): a wrong answer gets a user message saying which way the sum lies and the model tries
again; the right one ends the episode with reward 1.0 on the first try and 0.5 after. No tools,
and nothing of sparrow imported: `step` may return a dict of the Observation's fields.
"""

import re

_NUMBER = re.compile(r"-?\d+")


class Guess:
    tools: list = []  # no tools: the feedback comes as user messages

    def __init__(self, row: dict):
        self.question = row["prompt"]
        self.answer = int(row["answer"])
        self.tries = 0

    def reset(self) -> list[dict]:
        return [{"role": "user", "content": self.question}]

    def step(self, assistant_text: str) -> dict:
        self.tries += 1
        numbers = _NUMBER.findall(assistant_text)
        if numbers and int(numbers[-1]) == self.answer:
            return {"messages": [], "done": True, "reward": 1.0 if self.tries == 1 else 0.5}
        if not numbers:
            hint = "Answer with a number."
        else:
            way = "higher" if int(numbers[-1]) < self.answer else "lower"
            hint = f"Not {numbers[-1]}: the answer is {way}. Try again."
        return {"messages": [{"role": "user", "content": hint}], "done": False}


def make_env(row: dict) -> Guess:
    return Guess(row)
