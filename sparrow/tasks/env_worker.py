"""The side of the environment guard that runs in the isolated worker (env.isolate=true).

Kept apart from env_guard.py so that the worker imports no torch: it loads the factory once
(`worker_load`, the worker's init), holds each live episode's environment by its number, and
answers reset/step/close for it. Each function takes the factory's spec first (the guard passes
it to every call). A content that is not text goes back as `NonText`, since a user's object
may not unpickle in the trainer.
"""

import math
from dataclasses import dataclass
from typing import Any

from sparrow.tasks.environment import EnvFactory, EnvSpecError, Observation, load_env_factory


def as_observation(value: Any) -> Observation:
    """An Observation from a step's return value (an Observation, or a dict of its fields)."""
    if isinstance(value, dict):
        value = Observation(**value)
    if not isinstance(value, Observation):
        raise TypeError(f"step returned a {type(value).__name__}, not an Observation")
    reward = float(value.reward)
    if not math.isfinite(reward):
        raise ValueError(f"step returned a non-finite reward {reward}")
    return Observation(
        list(value.messages) if isinstance(value.messages, list) else value.messages,
        bool(value.done),
        reward,
        int(value.tool_calls),
        int(value.tool_errors),
    )


# In the worker: the factory by spec, and the live environments by episode.
_WORKER_FACTORIES: dict[str, EnvFactory] = {}
_WORKER_ENVS: dict[int, Any] = {}


def worker_load(spec: str) -> str | None:
    if spec not in _WORKER_FACTORIES:
        try:
            _WORKER_FACTORIES[spec] = load_env_factory(spec)
        except EnvSpecError as err:
            return str(err)
    return None


def worker_open(spec: str, episode: int, row: dict) -> list[dict]:
    env = _WORKER_FACTORIES[spec](row)
    _WORKER_ENVS[episode] = env
    return getattr(env, "tools", [])


def _worker_env(episode: int) -> Any:
    env = _WORKER_ENVS.get(episode)
    if env is None:
        raise RuntimeError("the episode's environment was lost when its worker was restarted")
    return env


def worker_reset(spec: str, episode: int) -> Any:
    return _worker_env(episode).reset()


def worker_step(spec: str, episode: int, text: str) -> Observation:
    observation = as_observation(_worker_env(episode).step(text))
    if isinstance(observation.messages, list):  # a user's object may not unpickle in the trainer
        observation.messages = [_picklable(m) for m in observation.messages]
    return observation


@dataclass
class NonText:
    """In place of a content that is not text, sent back from the worker: its type's name."""

    kind: str


def _picklable(message: Any) -> Any:
    if isinstance(message, dict) and not isinstance(message.get("content"), str):
        return dict(message, content=NonText(type(message.get("content")).__name__))
    return message


def worker_close(spec: str, episode: int) -> None:
    _WORKER_ENVS.pop(episode, None)
