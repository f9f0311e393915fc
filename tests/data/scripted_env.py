"""A scripted multi-turn environment for the trainer's tests (env.function=this file:make_env):
every assistant turn is answered with a tool message until the third, the reward is a parity of
the turns' text (it varies within a group on a random model, so advantages are nonzero)."""

import zlib

from sparrow.tasks.environment import Observation


class ScriptedEnv:
    tools: list = []

    def __init__(self, row: dict, turns: int = 3, words: int = 12):
        self.row, self.turns, self.words = row, turns, words
        self.seen: list[str] = []

    def reset(self) -> list[dict]:
        return [{"role": "user", "content": self.row["prompt"]}]

    def step(self, text: str) -> Observation:
        self.seen.append(text)
        if len(self.seen) >= self.turns:
            reward = float(zlib.crc32("".join(self.seen).encode()) % 2)
            return Observation([], done=True, reward=reward, tool_calls=len(self.seen) - 1)
        content = " ".join(["number"] * self.words) + f" {len(self.seen)}"
        return Observation([{"role": "tool", "content": content}], done=False, tool_calls=1)


def make_env(row: dict) -> ScriptedEnv:
    return ScriptedEnv(row)
