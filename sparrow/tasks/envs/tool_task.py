"""A question answered with tools: the building block of the built-in environments.

Each assistant turn either calls tools (one or more `<tool_call>`s: the results are the next
observation, reward 0) or answers (no call: the episode ends and the answer is scored). The
reward is 1.0 when the answer's number equals the reference exactly, else 0.0; it comes on the
last turn only, so an episode's reward (the sum over turns) is that score.

    env = ToolTask(row, tools=[Tool(fn, schema)], system_prompt="...")
"""

import re
from collections.abc import Callable

from sparrow.tasks.environment import Observation
from sparrow.tasks.tool_calls import Tool, run_tool_calls

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_CALL = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def row_question(row: dict) -> str:
    """The row's user message: "prompt" (the loader's), else a GSM8K-style "question"."""
    question = row.get("prompt", row.get("question"))
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"the row has no text 'prompt' or 'question' (keys: {sorted(row)})")
    return question


def row_answer(row: dict) -> str:
    """The reference: "answer", with a GSM8K worked solution's "#### N" reduced to N."""
    answer = str(row.get("answer", "")).strip()
    if "####" in answer:
        answer = answer.rsplit("####", 1)[1].strip()
    if not answer:
        raise ValueError("the row has no 'answer'")
    return answer.replace(",", "")


def final_number(text: str) -> float | None:
    """The answer a turn gives: its last \\boxed{} number, else its last number, outside any
    <think> block or tool call."""
    text = _CALL.sub(" ", _THINK.sub(" ", text))
    boxed = _BOXED.findall(text)
    numbers = _NUMBER.findall(boxed[-1] if boxed else text) or _NUMBER.findall(text)
    if not numbers:
        return None
    try:
        return float(numbers[-1].replace(",", ""))
    except ValueError:
        return None


def exact_number(text: str, reference: str) -> float:
    """1.0 when the final number of `text` equals the reference number, else 0.0."""
    got = final_number(text)
    try:
        expected = float(reference)
    except ValueError:
        return 0.0
    return 1.0 if got is not None and got == expected else 0.0


class ToolTask:
    """An Environment: the row's question, the tools, a reward on the final answer."""

    def __init__(
        self,
        row: dict,
        tools: list[Tool],
        system_prompt: str | None = None,
        score: Callable[[str, str], float] = exact_number,
        max_chars: int = 65536,
    ):
        self.question = row_question(row)
        self.answer = row_answer(row)
        self._tools = tools
        self.tools = [tool.schema for tool in tools]
        self.system_prompt = system_prompt
        self.score = score  # score(final turn's text, reference) -> reward
        self.max_chars = max_chars  # per tool result; the guard caps again at its own limit

    def reset(self) -> list[dict]:
        messages = [{"role": "user", "content": self.question}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def step(self, assistant_text: str) -> Observation:
        results = run_tool_calls(assistant_text, self._tools, self.max_chars)
        if results.calls == 0:
            return Observation([], done=True, reward=self.score(assistant_text, self.answer))
        return Observation(
            results.messages, done=False, tool_calls=results.calls, tool_errors=results.errors
        )
