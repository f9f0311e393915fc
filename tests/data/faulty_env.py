"""Environments that fail in each way the environment guard must survive (tests/tasks/
test_env_guard.py): `make_env` is a calculator task whose other tools raise, hang, return 10 MB or
return bytes; `make_faulty` fails in the environment itself, as `row["mode"]` says.

    env.function=tests/data/faulty_env.py:make_env
"""

import math
import time

from sparrow.tasks.environment import Observation
from sparrow.tasks.envs.calculator import SCHEMA, calculate
from sparrow.tasks.envs.tool_task import ToolTask
from sparrow.tasks.tool_calls import Tool


def _schema(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def _raises() -> str:
    raise RuntimeError("the tool broke")


def _spins() -> str:
    while True:  # a hang in Python code: the guard's asynchronous exception ends it
        pass


def _sleeps() -> str:
    time.sleep(3600)  # a hang in C code: only a killed worker ends it
    return "late"


def _ten_mb() -> str:
    return "x" * 10_000_000


def _bytes() -> bytes:
    return b"\x00\x01 not text"


TOOLS = [
    Tool(calculate, SCHEMA),
    Tool(_raises, _schema("raises")),
    Tool(_spins, _schema("spins")),
    Tool(_sleeps, _schema("sleeps")),
    Tool(_ten_mb, _schema("ten_mb")),
    Tool(_bytes, _schema("bytes")),
]


def make_env(row: dict) -> ToolTask:
    return ToolTask(row, TOOLS, max_chars=100_000_000)  # the guard's own cap is under test


class Faulty:
    """Fails where `mode` says: factory, reset, step, step_hang, reward, not_observation,
    bad_messages, non_text (else a one-turn episode that scores 1)."""

    tools: list = []

    def __init__(self, row: dict):
        self.mode = row["mode"]
        if self.mode == "factory":
            raise ValueError("cannot build")

    def reset(self) -> list[dict]:
        if self.mode == "reset":
            raise KeyError("no question")
        return [{"role": "user", "content": "question"}]

    def step(self, text: str) -> Observation:
        if self.mode == "step":
            raise RuntimeError("step broke")
        if self.mode == "step_hang":
            time.sleep(3600)
        if self.mode == "reward":
            return Observation([], done=True, reward=math.nan)
        if self.mode == "not_observation":
            return "done"
        if self.mode == "bad_messages":
            return Observation("not a list", done=False)
        if self.mode == "non_text":
            return Observation([{"role": "user", "content": {"a": 1}}], done=False)
        if self.mode == "exit":
            raise SystemExit(3)
        return Observation([], done=True, reward=1.0)


def make_faulty(row: dict) -> Faulty:
    return Faulty(row)
