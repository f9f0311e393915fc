"""`env.function=python`: a Python tool run in a sandbox worker, and a math task to use it on.

The model calls `python` with code; the code runs in a `Sandbox` worker process (sandbox.py: a
fresh interpreter, a clean environment, its own temporary directory) under limits set once in
each worker before any code runs:

- time: a call past `TIME_LIMIT_S` kills the worker (a fresh one serves the next call);
- memory: the address space is capped at `MEMORY_LIMIT_BYTES` (a big allocation is a MemoryError);
- no network: creating or using a socket is refused;
- files: writing, creating, renaming or removing outside the worker's temporary directory is
  refused, and no file may grow past `FILE_LIMIT_BYTES`; reading is allowed;
- no subprocesses, no `ctypes` (which could step around the rest).
The refusals are an audit hook (PEP 578) plus rlimits: they keep a model's code from hurting the
host by accident, which is what RL on math needs; they are not a boundary against code written
to escape (run untrusted code in a container). Each call starts from fresh globals; what it
prints, and the value of a last bare expression, is the result, cut at `MAX_OUTPUT_CHARS`.

The task: the row's math question (GSM8K-shaped, e.g. examples/gsm8k_mini.jsonl with
`data.prompt_column=question data.answer_extractor=gsm8k`), rewarded 1.0 for the exact number.
"""

import ast
import contextlib
import io
import os
import sys
import threading
import traceback

from sparrow.tasks.envs.tool_task import ToolTask
from sparrow.tasks.sandbox import Sandbox, SandboxError, SandboxTimeout
from sparrow.tasks.tool_calls import Tool

TIME_LIMIT_S = 5.0
MEMORY_LIMIT_BYTES = 1 << 30
FILE_LIMIT_BYTES = 16 << 20
MAX_OUTPUT_CHARS = 8192
SYSTEM_PROMPT = (
    "Solve the problem. You can run Python with the python tool: it prints what your code "
    "prints. End with the final answer as a number."
)
SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code and return what it prints (and a last expression's value).",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source code"}},
            "required": ["code"],
        },
    },
}
_BLOCKED = (
    "socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.forkpty", "pty.", "ctypes.", "os.kill", "os.killpg", "signal.pthread_kill",
)  # fmt: skip
_WRITES = (
    "os.remove", "os.unlink", "os.rename", "os.replace", "os.rmdir", "os.mkdir", "os.symlink",
    "os.link", "os.chmod", "os.chown", "os.truncate", "os.utime", "shutil.rmtree",
    "shutil.move", "shutil.copyfile", "shutil.copytree", "os.chdir", "os.chroot",
)  # fmt: skip


class PythonError(RuntimeError):
    """The model's code failed: the last lines of its traceback."""


class _Limits:
    """Run once in each fresh worker (picklable): the rlimits, then the audit hook."""

    def __init__(self, memory_bytes: int, file_bytes: int):
        self.memory_bytes = memory_bytes
        self.file_bytes = file_bytes

    def __call__(self) -> None:
        import resource

        sys.dont_write_bytecode = True
        resource.setrlimit(resource.RLIMIT_AS, (self.memory_bytes, self.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.file_bytes, self.file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        sys.addaudithook(_audit_hook(os.path.realpath(os.getcwd())))


def _audit_hook(root: str):
    def inside(path) -> bool:
        if isinstance(path, int):  # an open file descriptor: already allowed when opened
            return True
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return real == root or real.startswith(root + os.sep)

    def hook(event: str, args: tuple) -> None:
        if event.startswith(_BLOCKED):
            raise PermissionError(f"not allowed in the python tool: {event}")
        if event == "open":
            path, mode, flags = args
            writing = any(c in (mode or "") for c in "wax+") or flags & (
                os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
            )
            if writing and path is not None and not inside(path):
                raise PermissionError(f"writing outside the tool's directory: {path}")
        elif event.startswith(_WRITES):
            paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
            if event in ("os.chdir", "os.chroot") or not all(inside(p) for p in paths):
                raise PermissionError(f"not allowed outside the tool's directory: {event}")

    return hook


class _Capped(io.TextIOBase):
    """A stdout that keeps the first `limit` characters and counts the rest."""

    def __init__(self, limit: int):
        self.limit, self.kept, self.dropped = limit, 0, 0
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        room = self.limit - self.kept
        self.parts.append(text[:room])
        self.kept += min(room, len(text))
        self.dropped += max(0, len(text) - room)
        return len(text)

    def text(self) -> str:
        cut = f"\n[... {self.dropped} characters of output cut]" if self.dropped else ""
        return "".join(self.parts) + cut


def _run_code(code: str, max_chars: int) -> tuple[bool, str]:
    """In the worker: (ok, output) of `code` run as a fresh __main__."""
    out = _Capped(max_chars)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        tree = ast.parse(code, "<python-tool>")
        tail = tree.body[-1] if tree.body else None
        last = tail if isinstance(tail, ast.Expr) else None
        if last is not None:
            tree.body.pop()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            exec(compile(tree, "<python-tool>", "exec"), namespace)
            if last is not None:
                expression = compile(ast.Expression(last.value), "<python-tool>", "eval")
                value = eval(expression, namespace)
                if value is not None:
                    print(repr(value))
    except BaseException as err:  # the model's code failed (SystemExit too): said to the model
        lines = traceback.format_exception_only(type(err), err)
        tb = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == "<python-tool>"]
        where = f" (line {tb[-1].lineno})" if tb else ""
        printed = out.text()
        return False, (printed + "\n" if printed else "") + "".join(lines).strip() + where
    return True, out.text()


_sandbox: Sandbox | None = None
_sandbox_lock = threading.Lock()


def _the_sandbox() -> Sandbox:
    global _sandbox
    with _sandbox_lock:
        if _sandbox is None:
            _sandbox = Sandbox(_Limits(MEMORY_LIMIT_BYTES, FILE_LIMIT_BYTES))
        return _sandbox


def _strip_fence(code: str) -> str:
    lines = code.strip().splitlines()
    if lines and lines[0].startswith("```"):
        lines = lines[1:]
        if lines and lines[-1].strip() == "```":
            lines = lines[:-1]
    return "\n".join(lines)


def run_python(code: str) -> str:
    """The tool: what `code` prints; PythonError when it fails or runs past its time."""
    if not isinstance(code, str):
        raise PythonError(f"code must be text, got {type(code).__name__}")
    try:
        ok, output = _the_sandbox().call(
            _run_code, _strip_fence(code), MAX_OUTPUT_CHARS, timeout_s=TIME_LIMIT_S, name="python"
        )
    except SandboxTimeout:
        message = f"the code ran past the {TIME_LIMIT_S:g} s limit and was stopped"
        raise PythonError(message) from None
    except SandboxError as err:
        raise PythonError(f"the code's worker died ({err})") from None
    if not ok:
        raise PythonError(output)
    return output or "(no output)"


def make_env(row: dict) -> ToolTask:
    return ToolTask(row, [Tool(run_python, SCHEMA)], SYSTEM_PROMPT)
