"""A reward of the user's own, named on the command line instead of registered in sparrow's code.

    rl.reward.function=path/to/file.py:fn     # a file, from the current directory
    rl.reward.function=package.module:fn       # an importable module
    +rl.reward.kwargs.scale=2                  # fn(..., scale=2)

`fn(prompt, completion, reference, **kwargs) -> float | RewardResult`, or with `batched`
`fn(prompts, completions, references, **kwargs) -> list` (one score per completion). A function
that cannot be used (no such file, module or function, not callable, an import that raises, a
signature that does not take the call) raises `RewardFunctionError`, one line naming the setting;
the CLI checks this before any model is loaded (`check_user_reward`).

With `isolate` the calls run in a `Sandbox` worker process: the worker imports the file itself
(the function is never pickled, and the trainer never runs the user's code), and a call past its
deadline kills the worker, which is restarted for the next call.
"""

import difflib
import importlib
import importlib.util
import inspect
import sys
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from sparrow.tasks.reward_result import RewardTimeout
from sparrow.tasks.sandbox import Sandbox, SandboxError, SandboxTimeout

KEY = "rl.reward.function"
IMPORT_TIMEOUT_S = 300.0  # for the worker to import an isolated reward's file (a model, say)
_FILE_MODULES: dict[str, Any] = {}  # resolved path -> module: each file is imported once


class RewardFunctionError(ValueError):
    """The user's reward function cannot be used; str() is one line naming the setting."""


def load_reward_function(spec: str, kwargs: dict[str, Any], batched: bool) -> Callable:
    """The function `spec` names, checked to be callable as the trainer will call it."""
    source, _, name = spec.rpartition(":")
    if not source or not name.isidentifier():
        raise RewardFunctionError(
            f"{KEY}={spec!r}: expected path/to/file.py:FUNCTION or package.module:FUNCTION"
        )
    module = import_source(source, spec)
    fn = getattr(module, name, None)
    if fn is None:
        defined = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        close = difflib.get_close_matches(name, defined, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"it defines {sorted(defined)[:8]}"
        raise RewardFunctionError(f"{KEY}={spec!r}: {source} has no {name!r}; {hint}")
    if not callable(fn):
        raise RewardFunctionError(
            f"{KEY}={spec!r}: {name} is a {type(fn).__name__}, not a function"
        )
    _check_signature(fn, spec, name, kwargs, batched)
    return fn


def _check_signature(
    fn: Callable, spec: str, name: str, kwargs: dict[str, Any], batched: bool
) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without one: the guard counts what fails
        return
    try:
        signature.bind("prompt", "completion", "reference", **kwargs)
    except TypeError as err:
        args = "prompts, completions, references" if batched else "prompt, completion, reference"
        given = "".join(f", {k}=..." for k in kwargs)
        raise RewardFunctionError(
            f"{KEY}={spec!r}: {name}{signature} cannot be called as {name}({args}{given}) "
            f"({err}); rl.reward.kwargs gives the keyword arguments"
        ) from None


def import_source(source: str, spec: str, key: str = KEY) -> Any:
    """The module of a file path (anything ending in .py or holding a '/') or a module name;
    RewardFunctionError names `key`=`spec` (env.function uses it too)."""
    is_file = source.endswith(".py") or "/" in source
    try:
        if is_file:
            path = Path(source).expanduser().resolve()
            if not path.is_file():
                hint = f" (a relative path is taken from the current directory, {Path.cwd()})"
                if Path(source).expanduser().is_absolute():
                    hint = ""
                raise RewardFunctionError(f"{key}={spec!r}: no such file {path}{hint}")
            return _file_module(path)
        return importlib.import_module(source)
    except ModuleNotFoundError as err:
        if not is_file and err.name is not None and source.startswith(err.name):
            raise RewardFunctionError(
                f"{key}={spec!r}: no module named {err.name!r} (give path/to/file.py:FUNCTION "
                "for a file, or put the module's folder on PYTHONPATH)"
            ) from None
        raise RewardFunctionError(_import_failed(spec, source, err, key)) from None
    except RewardFunctionError:
        raise
    except (Exception, SystemExit) as err:  # SyntaxError included: the user's code, not ours
        raise RewardFunctionError(_import_failed(spec, source, err, key)) from None


def _file_module(path: Path) -> Any:
    key = str(path)
    if key not in _FILE_MODULES:
        module_name = f"sparrow_user_reward_{path.stem}_{abs(hash(key)):x}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:  # a path Python cannot import
            raise ImportError(f"{path} is not a Python source file")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module  # dataclasses and pickle look the module up by name
        try:
            module_spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
        _FILE_MODULES[key] = module
    return _FILE_MODULES[key]


def _import_failed(spec: str, source: str, err: BaseException, key: str = KEY) -> str:
    """One line: what importing the user's code raised, and where in it."""
    where = ""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "importlib" not in f.filename]
    if frames and not isinstance(err, SyntaxError):  # a SyntaxError's message has its line
        where = f" at {frames[-1].filename}:{frames[-1].lineno}"
    message = " ".join(str(err).split())
    return f"{key}={spec!r}: importing {source} raised {type(err).__name__}: {message}{where}"


def build_user_reward(
    spec: str,
    kwargs: dict[str, Any],
    batched: bool,
    isolate: bool,
    timeout_s: float | None,
    env_passthrough: Sequence[str] = (),
) -> Callable:
    """The reward function to guard: the user's with its kwargs, in this process or isolated
    (in a worker that sees only the sandbox's environment and `env_passthrough`)."""
    if isolate:
        return IsolatedReward(spec, kwargs, batched, timeout_s, env_passthrough)
    fn = load_reward_function(spec, kwargs, batched)
    return partial(fn, **kwargs) if kwargs else fn


def check_user_reward(
    spec: str,
    kwargs: dict[str, Any],
    batched: bool,
    isolate: bool,
    env_passthrough: Sequence[str] = (),
) -> None:
    """Raise RewardFunctionError if the function cannot be used; an isolated one is checked in a
    worker process of its own, so that its file is never imported by the trainer."""
    if isolate:
        IsolatedReward(spec, kwargs, batched, None, env_passthrough).close()
    else:
        load_reward_function(spec, kwargs, batched)


def resolved_spec(spec: str) -> str:
    """`spec` with a file path made absolute from the current directory: the isolated worker
    runs in a directory of its own, and a worker started later must find the same file."""
    source, colon, name = spec.rpartition(":")
    if source.endswith(".py") or "/" in source:
        source = str(Path(source).expanduser().resolve())
    return f"{source}{colon}{name}"


class IsolatedReward:
    """The user's reward called in a Sandbox worker, which imports its file and checks it."""

    enforces_timeout = True  # the sandbox kills the worker at the deadline: no guard thread

    def __init__(
        self,
        spec: str,
        kwargs: dict[str, Any],
        batched: bool,
        timeout_s: float | None,
        env_passthrough: Sequence[str] = (),
    ):
        self.spec, self.kwargs, self.batched = resolved_spec(spec), dict(kwargs), batched
        self.name = spec.rpartition(":")[2]  # what a timeout or a dead worker is said of
        self.timeout_s = timeout_s  # per completion; a batched call gets it times its size
        # Each fresh worker (the first, and each after a kill) imports the file before its
        # first call, so the import is charged to no call's deadline.
        init = partial(_check_in_worker, self.spec, self.kwargs, batched)
        self.sandbox = Sandbox(init, IMPORT_TIMEOUT_S, env_passthrough)
        try:
            problem = self.sandbox.call(
                _check_in_worker, self.spec, self.kwargs, batched, timeout_s=IMPORT_TIMEOUT_S
            )
        except (SandboxError, SandboxTimeout) as err:
            self.close()
            raise RewardFunctionError(f"{KEY}={spec!r}: the reward worker failed: {err}") from err
        if problem is not None:  # said with the function as the user wrote it
            self.close()
            problem = problem.replace(repr(self.spec), repr(spec), 1)
            if "importing" in problem:  # perhaps of a variable the worker does not see
                problem += " (the isolated worker sees few environment variables; "
                problem += "rl.reward.env_passthrough adds names)"
            raise RewardFunctionError(problem)

    def __call__(self, prompt, completion, reference) -> Any:
        n = len(completion) if self.batched else 1
        deadline = None if self.timeout_s is None else self.timeout_s * n
        try:
            return self.sandbox.call(
                _call_in_worker, self.spec, self.kwargs, prompt, completion, reference,
                timeout_s=deadline, name=self.name,
            )  # fmt: skip
        except SandboxTimeout as err:
            raise RewardTimeout(str(err)) from err

    def close(self) -> None:
        self.sandbox.close()


_WORKER_FUNCTIONS: dict[str, Callable] = {}  # in the worker: spec -> the checked function


def _check_in_worker(spec: str, kwargs: dict[str, Any], batched: bool) -> str | None:
    """Runs in the worker: import and check the function once; the error line, or None."""
    if spec not in _WORKER_FUNCTIONS:
        try:
            _WORKER_FUNCTIONS[spec] = load_reward_function(spec, kwargs, batched)
        except RewardFunctionError as err:
            return str(err)
    return None


def _call_in_worker(spec: str, kwargs: dict[str, Any], *args: Any) -> Any:
    fn = _WORKER_FUNCTIONS.get(spec)
    if fn is None:  # its import failed in this worker (the file changed since the check)
        fn = load_reward_function(spec, kwargs, batched=False)
    return fn(*args, **kwargs)
