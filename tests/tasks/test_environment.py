"""Multi-turn environments (issue 62): loading env.function, and the tokens of each turn.

The exactness that matters: an episode's tokens are the prompt rendered once, then each turn the
tokens the model sampled (its end token included), then the observation's tokens rendered alone.
On a template that strips earlier `<think>` blocks, re-rendering the history would change turn
1's tokens; these tests pin the token delta, which never touches them."""

import json
import re
from pathlib import Path

import pytest
from chat_templates import qwen_think_tokenizer

from sparrow.models.loading import tiny_tokenizer
from sparrow.tasks.env_guard import GuardedEnvFactory
from sparrow.tasks.environment import (
    BUILTIN_ENVS,
    EnvSpecError,
    capped_observation_ids,
    check_env_function,
    first_prompt_ids,
    load_env_factory,
    observation_ids,
    observation_text,
)
from sparrow.tasks.envs.calculator import SCHEMA

ROOT = Path(__file__).resolve().parents[2]
TURN_1 = (
    "<think>\nI should use the tool.\n</think>\n\n"
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>'
)
TURN_2 = "<think>\nThe tool says 391.\n</think>\n\nThe answer is 391."


@pytest.fixture(scope="module")
def qwen():
    return qwen_think_tokenizer()


@pytest.fixture(scope="module")
def chatml():
    return tiny_tokenizer()


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_episode_tokens_are_the_sampled_ones_plus_the_observation_on_a_think_template(qwen):
    question = [{"role": "user", "content": "What is 17 * 23?"}]
    prompt = first_prompt_ids(qwen, question, [SCHEMA])
    turn_1 = _ids(qwen, TURN_1 + "<|im_end|>")  # as sampled: the end token is the model's
    tool = [{"role": "tool", "content": "391", "name": "calculator"}]
    observation = observation_ids(qwen, tool)
    turn_2 = _ids(qwen, TURN_2 + "<|im_end|>")
    episode = prompt + turn_1 + observation + turn_2

    assert qwen.decode(observation) == (
        "\n<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    text = qwen.decode(episode)
    assert text.startswith(qwen.decode(prompt)) and "I should use the tool." in text
    assert text.endswith(TURN_1 + "<|im_end|>" + qwen.decode(observation) + TURN_2 + "<|im_end|>")
    # What re-rendering the history would have trained on instead: turn 1's thinking is gone.
    history = [
        *question,
        {"role": "assistant", "content": TURN_1},
        *tool,
        {"role": "assistant", "content": TURN_2},
    ]
    rerendered = qwen.apply_chat_template(history, tools=[SCHEMA], tokenize=False)
    assert "I should use the tool." not in rerendered
    assert _ids(qwen, rerendered) != episode
    assert qwen.decode(observation) in rerendered  # the delta is the template's own rendering


def test_several_tool_results_are_one_user_turn_on_qwen_and_one_turn_each_on_chatml(qwen, chatml):
    results = [{"role": "tool", "content": "391"}, {"role": "tool", "content": "7"}]
    assert observation_text(qwen, results) == (
        "\n<|im_start|>user\n<tool_response>\n391\n</tool_response>\n<tool_response>\n7\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert observation_text(chatml, results) == (
        "\n<|im_start|>tool\n391<|im_end|>\n<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n"
    )
    feedback = [{"role": "user", "content": "Try again."}]
    assert observation_text(chatml, feedback, end_token="<|im_end|>") == (
        "\n<|im_start|>user\nTry again.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_an_observation_over_max_tokens_is_cut_with_a_marker_and_keeps_the_frame(chatml):
    big = [{"role": "tool", "content": "42 " * 400}, {"role": "tool", "content": "short"}]
    whole = observation_ids(chatml, big)
    for max_tokens in (60, 120, 300):
        ids, cut = capped_observation_ids(chatml, big, max_tokens)
        text = chatml.decode(ids)
        assert len(ids) <= max_tokens < len(whole), (max_tokens, len(ids))
        said = [int(n) for n in re.findall(r"\[\.\.\. (\d+) tokens cut\]", text)]
        assert cut > 0 and sum(said) == cut, (cut, text)
        assert max_tokens < 120 or "\nshort<|im_end|>" in text  # the short one kept whole
        assert text.startswith("\n<|im_start|>tool\n42 42") and text.count("<|im_end|>") == 2
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert capped_observation_ids(chatml, big, len(whole)) == (whole, 0)
    assert observation_ids(chatml, big, max_tokens=None) == whole


def test_tools_go_to_the_template_or_into_a_system_message_when_it_ignores_them(qwen, chatml):
    question = [{"role": "user", "content": "What is 17 * 23?"}]
    schema = json.dumps(SCHEMA)
    on_qwen = qwen.decode(first_prompt_ids(qwen, question, [SCHEMA]))
    assert on_qwen.count(schema) == 1 and on_qwen.count("# Tools") == 1
    on_chatml = chatml.decode(first_prompt_ids(chatml, question, [SCHEMA]))
    assert on_chatml.startswith("<|im_start|>system\n# Tools") and on_chatml.count(schema) == 1
    assert on_chatml.endswith("What is 17 * 23?<|im_end|>\n<|im_start|>assistant\n")
    with_system = [{"role": "system", "content": "Be brief."}, *question]
    merged = chatml.decode(first_prompt_ids(chatml, with_system, [SCHEMA]))
    assert merged.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert merged.count("<|im_start|>system") == 1
    plain = chatml.decode(first_prompt_ids(chatml, question, []))
    assert plain == "<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n"


def test_built_in_file_and_module_factories_load(tmp_path, monkeypatch):
    for name in BUILTIN_ENVS:
        env = load_env_factory(name)({"prompt": "What is 2 + 3?", "answer": "5"})
        assert env.tools and env.reset()[-1]["content"] == "What is 2 + 3?"
    (tmp_path / "my_env.py").write_text(
        "from sparrow.tasks.envs.calculator import make_env as build\n"
        "def make_env(row):\n    return build(row)\n"
    )
    monkeypatch.chdir(tmp_path)
    assert load_env_factory("my_env.py:make_env").__name__ == "make_env"
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_env_factory("my_env:make_env").__name__ == "make_env"
    check_env_function(None)
    check_env_function("calculator")


_BAD = {
    "no such file": (None, "nope.py:make_env", "env.function='nope.py:make_env': no such file"),
    "no colon": (None, "calculatr", "expected a built-in (calculator, python)"),
    "no such function": ("def make_nev(row):\n    pass\n", "e.py:make_env", "did you mean"),
    "not callable": ("make_env = 3\n", "e.py:make_env", "make_env is a int, not callable"),
    "signature": ("def make_env():\n    pass\n", "e.py:make_env", "cannot be called as make_env"),
    "import raises": ("1 / 0\n", "e.py:make_env", "importing e.py raised ZeroDivisionError"),
    "no module": (None, "no_module_for_sparrow:make_env", "no module named"),
}


@pytest.mark.parametrize("case", sorted(_BAD))
def test_an_unusable_env_function_is_one_line_naming_the_setting(case, tmp_path, monkeypatch):
    source, spec, expected = _BAD[case]
    monkeypatch.chdir(tmp_path)
    if source is not None:
        (tmp_path / "e.py").write_text(source)
    with pytest.raises(EnvSpecError) as err:
        check_env_function(spec)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"env.function={spec!r}"), message
    assert expected in message, message


def test_the_guides_example_environment_plays_an_episode(monkeypatch):
    monkeypatch.chdir(ROOT)
    factory = GuardedEnvFactory("examples/guess_env.py:make_env", 5.0, 1000)
    env = factory({"prompt": "What is 7 + 34? Answer with just the number.", "answer": "41"})
    assert env.tools == [] and env.reset()[0]["content"].startswith("What is 7 + 34?")
    first = env.step("It is 40.")
    assert (
        first.messages == [{"role": "user", "content": "Not 40: the answer is higher. Try again."}]
        and not first.done
    )
    assert env.step("Then 41.").reward == 0.5 and env.done
    assert factory.stats.errors == 0
