"""Tool calls in the model's own format, and their results as chat messages.

The Hermes form that Qwen2.5/Qwen3 chat templates teach, one or more per assistant turn:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "17 * 23"}}
    </tool_call>

`parse_tool_calls` gives each call its name and arguments, or a `ToolCallError` that says what is
wrong with it (not JSON, no name, arguments not an object, an unknown tool, an unclosed tag), so
the model reads why its call failed. `run_tool_calls` runs the parsed calls and turns each result
into a "tool" message: an exception, a result that is not text, or one over `max_chars`
characters becomes an error message or is cut with a marker, counted, never raised.
"""

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
CUT_MARKER = "\n[... {n} characters cut: over env.max_observation_chars]"


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ToolCallError:
    message: str  # why the call cannot be run, said to the model


@dataclass
class Tool:
    """A function the model may call, with the JSON schema the chat template shows it."""

    fn: Callable[..., Any]  # fn(**arguments) -> str
    schema: dict  # {"type": "function", "function": {"name", "description", "parameters"}}

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]


@dataclass
class ToolResults:
    messages: list[dict] = field(default_factory=list)  # one "tool" message per call
    calls: int = 0
    errors: int = 0


def parse_tool_calls(
    text: str, tool_names: set[str] | None = None
) -> list[ToolCall | ToolCallError]:
    """Every `<tool_call>` of an assistant turn, in order; `tool_names`: the known tools."""
    calls: list[ToolCall | ToolCallError] = []
    for match in _CALL.finditer(text):
        body = match.group(1).strip()
        if not match.group(0).endswith("</tool_call>"):
            calls.append(ToolCallError("the <tool_call> is not closed by </tool_call>"))
            continue
        calls.append(_parse_one(body, tool_names))
    return calls


def _parse_one(body: str, tool_names: set[str] | None) -> ToolCall | ToolCallError:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as err:
        return ToolCallError(f"the tool call is not valid JSON ({err.msg} at char {err.pos})")
    if not isinstance(call, dict):
        kind = type(call).__name__
        return ToolCallError(f'a tool call is a JSON object {{"name", "arguments"}}, not {kind}')
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError('the tool call has no "name"')
    if tool_names is not None and name not in tool_names:
        known = ", ".join(sorted(tool_names)) or "none"
        return ToolCallError(f"there is no tool {name!r} (tools: {known})")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return ToolCallError(f'the "arguments" of {name} are a string that is not JSON')
    if not isinstance(arguments, dict):
        kind = type(arguments).__name__
        return ToolCallError(f'the "arguments" of {name} must be a JSON object, not {kind}')
    return ToolCall(name, arguments)


def tool_message(content: str, name: str | None = None) -> dict:
    message = {"role": "tool", "content": content}
    if name is not None:
        message["name"] = name
    return message


def as_tool_text(value: Any, max_chars: int) -> tuple[str, bool]:
    """(text for the model, whether it is an error): a non-text value is an error; a text over
    `max_chars` characters is cut, with a marker that says how much."""
    if not isinstance(value, str):
        kind = type(value).__name__
        return f"error: the tool returned a {kind}, not text", True
    if len(value) > max_chars:
        return value[:max_chars] + CUT_MARKER.format(n=len(value) - max_chars), False
    return value, False


def run_tool_calls(text: str, tools: list[Tool], max_chars: int = 65536) -> ToolResults:
    """Parse the assistant's calls, run each (errors said to the model, counted), and return the
    tool messages in call order. A tool's own deadline is its business (the Python tool runs in
    a sandbox worker); a hang here is caught by the environment guard's step deadline."""
    by_name = {tool.name: tool for tool in tools}
    results = ToolResults()
    for call in parse_tool_calls(text, set(by_name)):
        results.calls += 1
        if isinstance(call, ToolCallError):
            results.errors += 1
            results.messages.append(tool_message(f"error: {call.message}"))
            continue
        fn = by_name[call.name].fn
        try:
            inspect.signature(fn).bind(**call.arguments)
        except TypeError as err:  # the arguments do not fit the function
            results.errors += 1
            results.messages.append(tool_message(f"error: bad arguments for {call.name}: {err}"))
            continue
        except ValueError:  # no signature to check (a builtin): the call says what fails
            pass
        try:
            value = fn(**call.arguments)
        except (Exception, SystemExit) as err:  # the tool's failure, not the run's
            value, failed = f"error: {call.name} raised {type(err).__name__}: {err}", True
        else:
            value, failed = as_tool_text(value, max_chars)
        results.errors += failed
        results.messages.append(tool_message(value, call.name))
    return results


def tool_system_prompt(tools: list[dict]) -> str:
    """The tools described as Qwen2.5's template describes them, for a template without `tools=`
    support (SmolLM2's ChatML), so the model sees the same call format either way."""
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{schemas}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
