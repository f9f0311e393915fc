"""Hermes/Qwen tool calls (issue 62 item 2): parsed from the model's own text, several per turn,
each malformed form a clear error the model reads; results as tool messages, never raised."""

import pytest

from sparrow.tasks.tool_calls import (
    Tool,
    ToolCall,
    ToolCallError,
    as_tool_text,
    parse_tool_calls,
    run_tool_calls,
)

CALC = '<tool_call>\n{"name": "calc", "arguments": {"expression": "1 + 2"}}\n</tool_call>'


def test_calls_are_parsed_in_order_with_text_and_thinking_around_them():
    text = (
        "<think>\nadd, then multiply\n</think>\nFirst:\n"
        + CALC
        + '\nthen\n<tool_call>{"name": "calc", "arguments": "{\\"expression\\": \\"3*4\\"}"}'
        "</tool_call> and done"
    )
    assert parse_tool_calls(text, {"calc"}) == [
        ToolCall("calc", {"expression": "1 + 2"}),
        ToolCall("calc", {"expression": "3*4"}),  # arguments written as a JSON string
    ]
    assert parse_tool_calls("no calls here", {"calc"}) == []
    assert parse_tool_calls('<tool_call>{"name": "calc"}</tool_call>') == [ToolCall("calc", {})]


@pytest.mark.parametrize(
    "body, said",
    [
        ('{"name": "calc", "arguments": {"x": 1}', "not valid JSON"),
        ('["calc"]', 'a tool call is a JSON object {"name", "arguments"}, not list'),
        ('{"arguments": {}}', 'the tool call has no "name"'),
        ('{"name": "sql", "arguments": {}}', "there is no tool 'sql' (tools: calc)"),
        ('{"name": "calc", "arguments": [1, 2]}', 'the "arguments" of calc must be a JSON object'),
        ('{"name": "calc", "arguments": "x=1"}', "are a string that is not JSON"),
    ],
)
def test_each_malformed_call_says_what_is_wrong(body, said):
    [call] = parse_tool_calls(f"<tool_call>\n{body}\n</tool_call>", {"calc"})
    assert isinstance(call, ToolCallError) and said in call.message, call


def test_an_unclosed_call_is_an_error_and_the_calls_before_it_stand():
    calls = parse_tool_calls(CALC + '\n<tool_call>\n{"name": "calc", "argu', {"calc"})
    assert calls[0] == ToolCall("calc", {"expression": "1 + 2"})
    assert isinstance(calls[1], ToolCallError) and "not closed" in calls[1].message


def _schema(name):
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}


def _fails(**kwargs):
    raise ValueError("bad input")


def _exits():
    raise SystemExit(2)


TOOLS = [
    Tool(lambda expression: str(eval(expression, {})), _schema("calc")),  # test-only
    Tool(_fails, _schema("fails")),
    Tool(_exits, _schema("exits")),
    Tool(lambda: 7, _schema("number")),
    Tool(lambda: "y" * 50, _schema("long")),
]


def test_results_are_tool_messages_and_failures_are_errors_counted_never_raised():
    text = "".join(
        f'<tool_call>{{"name": "{n}", "arguments": {a}}}</tool_call>'
        for n, a in [
            ("calc", '{"expression": "1 + 2"}'),
            ("fails", "{}"),
            ("exits", "{}"),
            ("number", "{}"),
            ("calc", '{"expr": "1"}'),
            ("long", "{}"),
            ("nope", "{}"),
        ]
    )
    results = run_tool_calls(text, TOOLS, max_chars=20)
    contents = [m["content"] for m in results.messages]
    assert contents[0] == "3" and results.messages[0] == {
        "role": "tool",
        "content": "3",
        "name": "calc",
    }
    assert contents[1] == "error: fails raised ValueError: bad input"
    assert contents[2] == "error: exits raised SystemExit: 2"
    assert contents[3] == "error: the tool returned a int, not text"
    assert contents[4].startswith("error: bad arguments for calc: ")
    assert contents[5] == "y" * 20 + "\n[... 30 characters cut: over env.max_observation_chars]"
    assert contents[6].startswith("error: there is no tool 'nope'")
    assert (results.calls, results.errors) == (7, 5)


def test_as_tool_text():
    assert as_tool_text("ok", 10) == ("ok", False)
    assert as_tool_text(b"ok", 10) == ("error: the tool returned a bytes, not text", True)
