"""The guard that keeps a faulty environment from killing a run, as reward_guard.py does rewards.

`GuardedEnvFactory(spec, ...)` builds one `GuardedEnv` per prompt row; a guarded environment's
`reset`, `step` and `tools` never raise and never run past `timeout_s`:

- the factory, `reset` or `step` raising, or running past the deadline: the episode ends there
  with reward 0 (its state is unknown after a fault), counted in `EnvStats` as an error or a
  timeout; a factory or `reset` that fails gives the row's own prompt as the first message, so
  the episode still has one turn, which scores 0;
- a message whose content is not text becomes an error message (counted as a tool error), one
  over `max_observation_chars` characters is cut with a marker (a tool that returns 10 MB);
- a reward that is not a finite number scores 0, counted as an error.
The first fault logs one warning; the counts go to the step logger (`as_metrics`).

In this process a step past its deadline cannot be killed: its thread is abandoned with an
asynchronous exception (which ends a spin in Python code), and the episodes built after it run
in a worker process, as with `isolate=true`, so that a hang in C code is killed next time. With
`isolate` every environment is built and stepped in a `Sandbox` worker that imports the factory
itself; a step past its deadline kills the worker, and the episodes that lived in it end with
reward 0 at their next step (counted as errors).
"""

import itertools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, fields
from functools import partial
from typing import Any

from sparrow.tasks.env_worker import (
    NonText,
    as_observation,
    worker_close,
    worker_load,
    worker_open,
    worker_reset,
    worker_step,
)
from sparrow.tasks.environment import (
    BUILTIN_ENVS,
    KEY,
    EnvFactory,
    EnvSpecError,
    Observation,
    load_env_factory,
)
from sparrow.tasks.reward_guard import call_in_thread
from sparrow.tasks.sandbox import Sandbox, SandboxError, SandboxTimeout
from sparrow.tasks.tool_calls import CUT_MARKER
from sparrow.tasks.user_reward import resolved_spec

log = logging.getLogger(__name__)
IMPORT_TIMEOUT_S = 300.0  # for the isolated worker to import the factory's module


@dataclass
class EnvStats:
    episodes: int = 0  # environments built
    steps: int = 0  # assistant turns stepped
    errors: int = 0  # the factory, reset or step raised, or gave a bad value
    timeouts: int = 0  # reset or step ran past its deadline
    non_text: int = 0  # messages whose content was not text (an error message instead)
    cut: int = 0  # message contents cut at max_observation_chars
    last_error: str | None = None

    def add(self, other: "EnvStats") -> None:
        for f in fields(self):
            if f.name != "last_error":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        self.last_error = other.last_error or self.last_error

    def as_metrics(self) -> dict[str, float]:
        """Counts for the step logger."""
        names = ("episodes", "steps", "errors", "timeouts", "non_text", "cut")
        return {f"env/{name}": float(getattr(self, name)) for name in names}


class _Fault(Exception):
    """A fault of the environment, already counted; the episode ends with reward 0."""


class GuardedEnv:
    """One episode's environment, in this process or in the factory's worker. Never raises."""

    def __init__(self, factory: "GuardedEnvFactory", row: dict, episode: int):
        self._factory = factory
        self._row = row
        self._episode: int | None = episode  # its key in the worker, when isolated
        self._isolated = factory.isolate
        self._env: Any = None  # the environment object, in this process
        self.done = False  # no more steps: the episode ended, or a fault ended it
        self.tools: list[dict] = []
        self._call(self._open, "building the environment")

    @property
    def stats(self) -> EnvStats:
        return self._factory.stats

    def _open(self) -> None:
        if self._isolated:
            tools = self._factory.worker_call(worker_open, self._episode, self._row)
        else:
            assert self._factory.factory is not None, "in-process environments need the factory"
            self._env = self._factory.factory(self._row)
            tools = getattr(self._env, "tools", [])
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise TypeError(f"env.tools must be a list of JSON-schema dicts, got {tools!r:.80}")
        self.tools = tools

    def reset(self) -> list[dict]:
        """The first messages; after a fault, the row's prompt (the episode then scores 0)."""
        if not self.done:
            messages = self._call(self._reset, "reset")
            if messages is not None:
                return messages
        return [{"role": "user", "content": str(self._row.get("prompt", ""))}]

    def _reset(self) -> list[dict]:
        if self._isolated:
            messages = self._factory.worker_call(worker_reset, self._episode)
        else:
            messages = self._env.reset()
        return self._checked_messages(messages, "reset")

    def step(self, assistant_text: str) -> Observation:
        if self.done:
            return Observation([], done=True)
        self._factory.count(steps=1)
        observation = self._call(lambda: self._step(assistant_text), "step")
        if observation is None:  # a fault: counted, and the episode ends with reward 0
            return Observation([], done=True)
        self.done = observation.done
        if self.done:
            self.close()
        return observation

    def _step(self, text: str) -> Observation:
        if self._isolated:
            value = self._factory.worker_call(worker_step, self._episode, text)
        else:
            value = self._env.step(text)
        observation = as_observation(value)
        bad = _non_text(observation.messages)
        messages = self._checked_messages(observation.messages, "step")
        observation.messages = messages
        observation.tool_errors += bad
        return observation

    def _checked_messages(self, messages: Any, where: str) -> list[dict]:
        """Messages with text contents: a non-text content becomes an error message, a long one
        is cut; anything else that is not a list of role/content dicts is a fault."""
        if not isinstance(messages, list):
            raise TypeError(f"{where} returned a {type(messages).__name__}, not a message list")
        limit = self._factory.max_observation_chars
        checked = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise TypeError(f"{where} returned a message that is not a role/content dict")
            content = m.get("content")
            if not isinstance(content, str):
                kind = content.kind if isinstance(content, NonText) else type(content).__name__
                self._factory.count(non_text=1, error=f"{where} returned a {kind} content")
                content = f"error: the environment returned a {kind}, not text"
            elif len(content) > limit:
                self._factory.count(cut=1)
                content = content[:limit] + CUT_MARKER.format(n=len(content) - limit)
            checked.append(dict(m, content=content))
        return checked

    def _call(self, fn, what: str) -> Any:
        """fn() under the deadline; on a fault: counted, the episode over, None."""
        timeout_s = self._factory.timeout_s
        try:
            if self._isolated:
                return fn()  # the worker call carries the deadline
            done, value = call_in_thread(fn, (), timeout_s, "env-step")
            if not done:
                self._factory.overran(timeout_s)
                raise TimeoutError(f"{what} took over {timeout_s} s")
            return value
        except (TimeoutError, SandboxTimeout) as err:
            self._factory.count(timeouts=1, error=f"{what}: {err}")
        except SandboxError as err:  # the worker's message names the exception already
            self._factory.count(errors=1, error=f"{what}: {err}")
        except (Exception, SystemExit) as err:  # the user's code failed, not the run
            self._factory.count(errors=1, error=f"{what}: {type(err).__name__}: {err}")
        self.done = True
        self.close()
        return None

    def close(self) -> None:
        """Free the episode's environment (in the worker, when isolated)."""
        if self._isolated and self._episode is not None:
            self._factory.forget(self._episode)
            self._episode = None
        self._env = None


def _non_text(messages: Any) -> int:
    if not isinstance(messages, list):
        return 0
    return sum(isinstance(m, dict) and not isinstance(m.get("content"), str) for m in messages)


class GuardedEnvFactory:
    """Builds a `GuardedEnv` per prompt row from `spec` (env.function); holds the counts and,
    when isolated, the worker. Thread-safe: rollout and evaluation may build episodes at once."""

    def __init__(
        self,
        spec: str,
        timeout_s: float = 10.0,
        max_observation_chars: int = 65536,
        isolate: bool = False,
        env_passthrough: Sequence[str] = (),
    ):
        self.spec = spec
        self.timeout_s = timeout_s  # per reset or step (and per build)
        self.max_observation_chars = max_observation_chars  # per message, before tokenizing
        self.env_passthrough = tuple(env_passthrough)  # variables the worker may see
        self.stats = EnvStats()  # totals over the factory's lifetime
        self._lock = threading.Lock()
        self._warned = False
        self._episodes = itertools.count()
        self.factory: EnvFactory | None = None
        self.sandbox: Sandbox | None = None
        self.isolate = False
        if isolate:
            self._start_worker()
        else:
            self.factory = load_env_factory(spec)

    def __call__(self, row: dict) -> GuardedEnv:
        env = GuardedEnv(self, row, next(self._episodes))
        self.count(episodes=1)
        return env

    def _start_worker(self) -> None:
        target = resolved_spec(BUILTIN_ENVS.get(self.spec, self.spec))
        self._target = target
        init = partial(worker_load, target)
        self.sandbox = Sandbox(init, IMPORT_TIMEOUT_S, self.env_passthrough)
        try:
            problem = self.sandbox.call(worker_load, target, timeout_s=IMPORT_TIMEOUT_S)
        except (SandboxError, SandboxTimeout) as err:
            self.close()
            message = f"{KEY}={self.spec!r}: the environment worker failed: {err}"
            raise EnvSpecError(message) from err
        if problem is not None:
            self.close()
            raise EnvSpecError(problem.replace(repr(target), repr(self.spec), 1))
        self.isolate = True

    def worker_call(self, fn, *args: Any) -> Any:
        assert self.sandbox is not None, "isolated environments need the worker"
        return self.sandbox.call(fn, self._target, *args, timeout_s=self.timeout_s, name="env")

    def forget(self, episode: int) -> None:
        if self.sandbox is not None:
            try:
                self.sandbox.call(worker_close, self._target, episode, timeout_s=self.timeout_s)
            except (SandboxError, SandboxTimeout):
                pass  # the worker was restarted: the episode is gone already

    def count(self, error: str | None = None, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self.stats, name, getattr(self.stats, name) + n)
            if error is None:
                return
            self.stats.last_error = error
            warn, self._warned = not self._warned, True
        if warn:
            log.warning(
                "environment %r: %s; the episode scores 0 or the model reads an error, the run "
                "goes on (counted in env/errors, env/timeouts, env/non_text; warned once)",
                self.spec, " ".join(error.split())[:300],
            )  # fmt: skip

    def overran(self, timeout_s: float) -> None:
        """The first overrun in this process: later episodes run in a killable worker."""
        with self._lock:
            if self.isolate or self.sandbox is not None:
                return
            try:
                self._start_worker()
            except EnvSpecError as err:
                log.warning("environment %r overran; no worker for it: %s", self.spec, err)
                return
        log.warning(
            "environment %r overran its %s s deadline in this process, where it cannot be "
            "killed: new episodes run in a worker process killed at the deadline, as with "
            "env.isolate=true (set it to start that way)",
            self.spec, timeout_s,
        )  # fmt: skip

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
