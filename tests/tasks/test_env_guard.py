"""The environment guard (issue 62, faults): a tool that raises, hangs past its deadline,
returns 10 MB or returns bytes, a malformed tool call, and an environment that fails itself, are
each an error observation or a 0 reward, counted, with one warning, and the run goes on; the same
with `isolate=true`, where a hang kills the worker."""

import threading
from pathlib import Path

import pytest
from hang_guard import HANG_GUARD_S

from sparrow.tasks.env_guard import GuardedEnvFactory
from sparrow.tasks.environment import EnvSpecError

TOOLS_ENV = str(Path(__file__).resolve().parents[1] / "data" / "faulty_env.py") + ":make_env"
FAULTY_ENV = TOOLS_ENV.replace(":make_env", ":make_faulty")
ROW = {"prompt": "What is 17 * 23?", "answer": "391"}
TIMEOUT_S = 2.0  # the deadline under test; every healthy call takes milliseconds
CAP = 4096  # env.max_observation_chars


def _call(name: str, arguments: str = "{}") -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


@pytest.fixture(params=[False, True], ids=["in-process", "isolated"])
def tools_env(request):
    factory = GuardedEnvFactory(TOOLS_ENV, TIMEOUT_S, CAP, isolate=request.param)
    yield factory
    factory.close()


def _guarded(step, text: str):
    """step(text), or a test failure if the environment guard lets it hang."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(step(text)), daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    if not result:
        pytest.fail(f"the step hung past the hang guard ({HANG_GUARD_S} s)")
    return result[0]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sparrow.tasks.env_guard"]


# (assistant turn, what the tool message says) for faults the episode survives
_TOOL_FAULTS = {
    "raises": (_call("raises"), "error: raises raised RuntimeError: the tool broke"),
    "non-text": (_call("bytes"), "error: the tool returned a bytes, not text"),
    "malformed json": ('<tool_call>\n{"name": "calculator", }\n</tool_call>', "not valid JSON"),
    "unknown tool": (_call("nope"), "there is no tool 'nope'"),
    "unclosed": ('<tool_call>\n{"name": "calculator"', "not closed by </tool_call>"),
    "bad arguments": (_call("calculator", '{"expr": "1"}'), "bad arguments for calculator"),
}


@pytest.mark.parametrize("fault", sorted(_TOOL_FAULTS))
def test_a_failed_tool_call_is_an_error_observation_and_the_episode_goes_on(tools_env, fault):
    turn, said = _TOOL_FAULTS[fault]
    env = tools_env(ROW)
    assert env.reset()[-1]["content"] == ROW["prompt"] and len(env.tools) == 6
    observation = env.step(turn)
    assert not observation.done and observation.reward == 0.0
    assert (observation.tool_calls, observation.tool_errors) == (1, 1)
    [message] = observation.messages
    assert message["role"] == "tool" and message["content"].startswith("error: ")
    assert said in message["content"], message["content"]
    # the model reads the error and goes on: a good call, then the answer, scores 1
    good = env.step(_call("calculator", '{"expression": "17 * 23"}'))
    assert good.messages[0]["content"] == "391" and good.tool_errors == 0
    final = env.step("The answer is 391.")
    assert final.done and final.reward == 1.0 and env.done


def test_ten_megabytes_of_tool_output_are_cut_with_a_marker(tools_env):
    env = tools_env(ROW)
    env.reset()
    observation = env.step(_call("ten_mb") + _call("calculator", '{"expression": "2+2"}'))
    big, small = observation.messages
    assert len(big["content"]) < CAP + 100 and big["content"].startswith("x" * CAP)
    assert big["content"].endswith(
        f"[... {10_000_000 - CAP} characters cut: over env.max_observation_chars]"
    )
    assert small["content"] == "4" and observation.tool_calls == 2
    assert tools_env.stats.cut == 1 and not observation.done


@pytest.mark.parametrize("tool", ["spins", "sleeps"])
def test_a_tool_that_hangs_ends_its_episode_with_reward_0_and_the_run_goes_on(
    tools_env, tool, caplog
):
    env, other = tools_env(ROW), tools_env(ROW)
    env.reset(), other.reset()
    observation = _guarded(env.step, _call(tool))
    assert observation.done and observation.reward == 0.0 and observation.messages == []
    assert tools_env.stats.timeouts == 1 and env.done
    assert env.step("391").done  # an ended episode stays ended
    # a fresh episode after the hang works; in this process it now runs in a worker
    fresh = tools_env(ROW)
    fresh.reset()
    assert (
        fresh.step(_call("calculator", '{"expression": "17*23"}')).messages[0]["content"] == "391"
    )
    assert fresh.step("391").reward == 1.0
    assert tools_env.isolate
    warnings = _warnings(caplog)
    assert any("took over 2.0 s" in w for w in warnings), warnings
    # the episode that was in flight beside it: goes on in this process; in the killed worker
    # it was lost, and ends with reward 0, counted
    last = other.step("391")
    assert last.done and last.reward == (0.0 if other._isolated else 1.0)
    assert tools_env.stats.errors == (1 if other._isolated else 0)


_ENV_FAULTS = {
    "factory": ("errors", "building the environment: ValueError: cannot build"),
    "reset": ("errors", "reset: KeyError: 'no question'"),
    "step": ("errors", "step: RuntimeError: step broke"),
    "step_hang": ("timeouts", "step"),
    "reward": ("errors", "non-finite reward nan"),
    "not_observation": ("errors", "step returned a str, not an Observation"),
    "bad_messages": ("errors", "not a message list"),
    "exit": ("errors", "SystemExit"),
}


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
@pytest.mark.parametrize("mode", sorted(_ENV_FAULTS))
def test_an_environment_that_fails_scores_0_counted_and_warned_once(isolate, mode, caplog):
    counter, said = _ENV_FAULTS[mode]
    factory = GuardedEnvFactory(FAULTY_ENV, TIMEOUT_S, CAP, isolate=isolate)
    try:
        env = factory({"mode": mode, "prompt": "the row's own question"})
        first = env.reset()
        if mode in ("factory", "reset"):  # the row's prompt, so that the episode has its turn
            assert first == [{"role": "user", "content": "the row's own question"}]
        observation = _guarded(env.step, "an answer")
        assert observation.done and observation.reward == 0.0 and observation.messages == []
        assert getattr(factory.stats, counter) == 1, factory.stats
        assert said in factory.stats.last_error, factory.stats.last_error
        again = factory({"mode": mode, "prompt": "q"})  # a second fault: counted, not warned
        again.reset(), _guarded(again.step, "x")
        assert getattr(factory.stats, counter) == 2
        healthy = factory({"mode": "ok"})
        healthy.reset()
        assert healthy.step("x").reward == 1.0
        assert len(_warnings(caplog)) == 1 + (mode == "step_hang" and not isolate), _warnings(
            caplog
        )
        assert factory.stats.as_metrics()["env/episodes"] == 3.0
    finally:
        factory.close()


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_a_non_text_message_becomes_an_error_message_counted_as_a_tool_error(isolate):
    factory = GuardedEnvFactory(FAULTY_ENV, TIMEOUT_S, CAP, isolate=isolate)
    try:
        env = factory({"mode": "non_text"})
        env.reset()
        observation = env.step("x")
        assert not observation.done and observation.tool_errors == 1
        assert observation.messages == [
            {"role": "user", "content": "error: the environment returned a dict, not text"}
        ]
        assert factory.stats.non_text == 1 and factory.stats.errors == 0
    finally:
        factory.close()


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_an_unusable_spec_is_refused_in_one_line(isolate, tmp_path):
    with pytest.raises(EnvSpecError) as err:
        GuardedEnvFactory(str(tmp_path / "none.py") + ":make_env", isolate=isolate)
    assert "\n" not in str(err.value) and "no such file" in str(err.value)


def test_an_isolated_built_in_runs_in_the_worker_and_the_trainer_never_builds_it():
    factory = GuardedEnvFactory("calculator", TIMEOUT_S, CAP, isolate=True)
    try:
        assert factory.factory is None and factory.isolate
        env = factory(ROW)
        env.reset()
        assert (
            env.step(_call("calculator", '{"expression": "17*23"}')).messages[0]["content"] == "391"
        )
        assert env.step("391").reward == 1.0
    finally:
        factory.close()
