"""The built-in environments (issue 62 item 5): `calculator` (exact, deterministic) and `python`
(code in a sandbox worker: time and memory limits, no network, no writes outside its directory)
with the math task over the shipped GSM8K-shaped sample."""

import json
from pathlib import Path

import pytest

from sparrow.tasks.environment import load_env_factory
from sparrow.tasks.envs import python_tool
from sparrow.tasks.envs.calculator import calculate
from sparrow.tasks.envs.python_tool import PythonError, run_python
from sparrow.tasks.envs.tool_task import exact_number, final_number, row_answer

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT / "examples" / "gsm8k_mini.jsonl"


def _call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.mark.parametrize(
    "expression, value",
    [
        ("4821 * 377", "1817517"),
        ("(17 + 4) * 23 - 5", "478"),
        ("7 / 4", "1.75"),
        ("1 / 3", "1/3"),
        ("0.1 + 0.2", "0.3"),
        ("2 ** 10 // 3 % 7", "5"),
        ("-(3 - 10)", "7"),
        ("1,250 * 4", "5000"),
        ("2^8", "256"),
    ],
)
def test_calculator_is_exact(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression, said",
    [
        ("__import__('os').system('ls')", "only numbers and"),
        ("9 ** 9 ** 9", "exponents are whole numbers up to 64"),
        ("1 / 0", "division by zero"),
        ("10 ** 60 * 10 ** 60 * 10 ** 60 * 10 ** 60", "a number over 200 digits"),
        ("1 +", "cannot parse"),
        ("1" * 300, "over 200 characters"),
    ],
)
def test_calculator_refuses_what_it_does_not_compute(expression, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace("*", r"\*")):
        calculate(expression)


def test_calculator_episode_calls_the_tool_then_answers_for_reward_1():
    env = load_env_factory("calculator")({"prompt": "What is 4821 * 377?", "answer": "1817517"})
    assert env.tools[0]["function"]["name"] == "calculator"
    assert [m["role"] for m in env.reset()] == ["system", "user"]
    observation = env.step("<think>big</think>" + _call("calculator", expression="4821 * 377"))
    assert not observation.done and observation.messages[0]["content"] == "1817517"
    assert (observation.tool_calls, observation.tool_errors) == (1, 0)
    final = env.step("The answer is 1,817,517.")
    assert final.done and final.reward == 1.0 and final.messages == []
    wrong = load_env_factory("calculator")({"prompt": "q", "answer": "1817517"})
    assert wrong.step("It is 1817516.").reward == 0.0  # an answer without the tool: scored


def test_final_number_reads_the_answer_outside_thinking_and_calls():
    assert final_number("<think>maybe 12</think>so 13 apples") == 13.0
    assert final_number("\\boxed{42} then 7") == 42.0
    assert final_number(_call("calculator", expression="1+1") + " no number") is None
    assert exact_number("= 8.0", "8") == 1.0 and exact_number("8", "eight") == 0.0
    assert row_answer({"answer": "Tom has 3 + 5 = <<3+5=8>>8 apples now.\n#### 1,008"}) == "1008"


def test_python_tool_runs_code_and_reports_its_errors():
    assert run_python("print(17 * 23)") == "391\n"
    assert run_python("x = 3\nx * 2") == "6\n"  # a last bare expression is shown
    assert run_python("```python\nprint('fenced')\n```") == "fenced\n"
    assert run_python("y = 1") == "(no output)"
    with pytest.raises(PythonError, match=r"ZeroDivisionError: division by zero \(line 2\)"):
        run_python("print('before')\n1 / 0")


@pytest.mark.parametrize(
    "code, said",
    [
        ("import socket\nsocket.socket()", "not allowed in the python tool: socket"),
        ("import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9')", "socket"),
        ("open('/tmp/sparrow_python_tool_escape.txt', 'w')", "writing outside the tool's"),
        ("open('../escape.txt', 'w')", "writing outside the tool's directory"),
        ("import os\nos.remove('/etc/hostname')", "not allowed outside the tool's directory"),
        ("import os\nos.system('true')", "not allowed in the python tool: os.system"),
        ("import subprocess\nsubprocess.run(['true'])", "subprocess.Popen"),
        ("import ctypes\nctypes.CDLL(None)", "ctypes.dlopen"),
        ("b = bytearray(4 * 1024 ** 3)", "MemoryError"),
    ],
)
def test_python_tool_refuses_network_outside_writes_processes_and_big_memory(code, said):
    with pytest.raises(PythonError, match=said.replace("(", r"\(")):
        run_python(code)
    assert not Path("/tmp/sparrow_python_tool_escape.txt").exists()
    assert run_python("print('still serving')") == "still serving\n"


def test_python_tool_writes_inside_its_directory_and_cuts_long_output():
    assert (
        run_python("open('note.txt', 'w').write('kept')\nprint(open('note.txt').read())")
        == "kept\n"
    )
    out = run_python("print('z' * 100_000)")
    assert out.startswith("z" * python_tool.MAX_OUTPUT_CHARS)
    assert out.endswith(f"[... {100_001 - python_tool.MAX_OUTPUT_CHARS} characters of output cut]")


def test_python_tool_past_its_time_limit_is_stopped_and_the_next_call_is_served(monkeypatch):
    monkeypatch.setattr(python_tool, "TIME_LIMIT_S", 1.0)
    with pytest.raises(PythonError, match="ran past the 1 s limit and was stopped"):
        run_python("while True:\n    pass")
    assert run_python("print(2 + 2)") == "4\n"


def test_python_math_episode_over_the_shipped_sample():
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()]
    row = rows[1]  # "A box holds 6 eggs. How many eggs are in 4 boxes?" ... #### 24
    env = load_env_factory("python")(row)
    assert env.reset()[-1]["content"] == row["question"] and env.answer == "24"
    observation = env.step(_call("python", code="print(6 * 4)"))
    assert observation.messages[0]["content"] == "24\n" and observation.tool_errors == 0
    bad = env.step(_call("python", code="print(6 *"))
    assert bad.tool_errors == 1 and "SyntaxError" in bad.messages[0]["content"]
    assert env.step("There are 24 eggs.").reward == 1.0
