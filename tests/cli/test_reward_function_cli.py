"""`rl.reward.function` from the command line (issue 50): `sparrow-train preset=tiny
rl.reward.function=tests/data/my_reward.py:score` trains with the user's reward, and a reward
that cannot be used (no file, no function, not callable, a signature that does not take the
call, an import that raises) is one line on stderr and exit 2 before any model is loaded."""

import json
import os
import re
import shlex
from pathlib import Path

import pytest

import sparrow.cli.train as train_cli
from sparrow.cli.train import main

ROOT = Path(__file__).resolve().parents[2]
MY_REWARD = "tests/data/my_reward.py:score"  # relative, as the guide writes it
GUIDE = ROOT / "docs" / "guide" / "your-model-data-reward.md"


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if the CLI gets past its start-up checks (the model is loaded after)."""

    def loads_the_model(*args, **kwargs):
        pytest.fail("the CLI went on to load the model")

    monkeypatch.setattr(train_cli, "_run_or_lost_rank", loads_the_model)


_BAD = {
    "missing file": (None, "nope.py:score", "no such file {tmp}/nope.py"),
    "missing function": (
        "def scor(p, c, r):\n    return 1.0\n",
        "r.py:score",
        "did you mean 'scor'?",
    ),
    "not callable": ("score = 0.5\n", "r.py:score", "score is a float, not a function"),
    "wrong signature": (
        "def score(completion):\n    return 1.0\n",
        "r.py:score",
        "score(completion) cannot be called as score(prompt, completion, reference)",
    ),
    "import error": (
        "x = 1\nimport no_such_package_for_sparrow\n",
        "r.py:score",
        "importing {tmp}/r.py raised ModuleNotFoundError: No module named "
        "'no_such_package_for_sparrow' at {tmp}/r.py:2",
    ),
    "syntax error": ("def score(p, c, r)\n    return 1\n", "r.py:score", "raised SyntaxError"),
    "missing module": (None, "no_such_module_for_sparrow:score", "no module named"),
}


@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.parametrize("case", sorted(_BAD))
def test_a_reward_that_cannot_be_used_is_one_line_and_exit_2(
    case, isolate, tmp_path, capsys, no_model_load
):
    source, function, expected = _BAD[case]
    if source is not None:
        (tmp_path / "r.py").write_text(source)
    if function.split(":")[0].endswith(".py"):
        function = f"{tmp_path}/{function}"
    argv = ["preset=tiny", f"run_dir={tmp_path}/run", f"rl.reward.function={function}"]
    code = main([*argv, f"rl.reward.isolate={str(isolate).lower()}", "dry_run=true"])
    line = _one_line(capsys.readouterr().err)
    assert code == 2, line
    assert line.startswith(f"sparrow-train: error: rl.reward.function='{function}': "), line
    assert expected.format(tmp=tmp_path) in line, line


def test_kwargs_the_function_does_not_take_are_refused(
    tmp_path, capsys, no_model_load, monkeypatch
):
    monkeypatch.chdir(ROOT)
    argv = ["preset=tiny", f"run_dir={tmp_path}", f"rl.reward.function={MY_REWARD}"]
    assert main([*argv, "+rl.reward.kwargs.wrongg=0.1"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "got an unexpected keyword argument 'wrongg'" in line, line


def _guide_command() -> list[str]:
    """The guide's one-line rl.reward.function command ("Your reward"), as the shell splits it."""
    lines = GUIDE.read_text().splitlines()
    found = [line for line in lines if re.match(r"sparrow-train .*rl\.reward\.function=", line)]
    assert len(found) == 1, found
    return shlex.split(found[0])


def test_train_two_steps_with_the_users_reward(tmp_path, capsys, monkeypatch):
    """The guide's command as written (from the checkout, as a user runs it), plus a run dir of the
    test's own, the reward's log (what the function returned) and a score for a wrong answer that
    the built-in math reward would not give (a random model is always wrong)."""
    monkeypatch.chdir(ROOT)
    command = _guide_command()
    assert command[:3] == ["sparrow-train", "preset=tiny", f"rl.reward.function={MY_REWARD}"]
    log = tmp_path / "calls.jsonl"
    argv = [*command[1:], "rl.steps=2", "rl.eval.every=0", f"run_dir={tmp_path}/run"]
    argv += [f"+rl.reward.kwargs.log_path={log}", "+rl.reward.kwargs.wrong=0.25"]
    assert main(argv) == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = [row for row in rows if "reward/mean" in row]
    calls = [json.loads(line)["score"] for line in log.open()]
    assert [row["reward/calls"] for row in steps] == [16.0, 16.0]
    assert len(calls) == 32 and all(row["reward/errors"] == 0 for row in steps)
    for i, row in enumerate(steps):  # each step logs the mean of what the function returned
        assert row["reward/mean"] == pytest.approx(sum(calls[16 * i : 16 * (i + 1)]) / 16)
    assert 0.25 in calls  # the kwargs reached the function


def test_a_relative_path_is_said_to_be_taken_from_the_current_directory(
    tmp_path, capsys, no_model_load, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert main(["preset=tiny", "run_dir=run", "rl.reward.function=my_reward.py:score"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.endswith(
        f"no such file {tmp_path}/my_reward.py (a relative path is taken from the current "
        f"directory, {tmp_path})"
    ), line


_SPINS_ONCE = """
import os
from pathlib import Path


def score(prompt, completion, reference, marker):
    if not Path(marker).exists():  # the run's first call spins, in this process
        Path(marker).write_text(str(os.getpid()))
        while True:
            pass
    with open(marker + ".calls", "a") as calls:
        calls.write(f"{os.getpid()}\\n")
    return 1.0
"""


def test_an_in_process_reward_that_spins_goes_on_in_a_worker(tmp_path, capsys, caplog):
    """Issue 61 item 3 through a real step: the spinning call costs its deadline once, with one
    warning naming rl.reward.isolate=true, and the step's other 15 completions are scored in a
    worker process (each spinning thread used to stay, and 2 steps took 7 minutes)."""
    (tmp_path / "spins.py").write_text(_SPINS_ONCE)
    marker = tmp_path / "spun"
    argv = ["preset=tiny", "rl.steps=1", "rl.eval.every=0", f"run_dir={tmp_path}/run"]
    argv += [f"rl.reward.function={tmp_path}/spins.py:score", "rl.reward.timeout_s=1"]
    assert main([*argv, f"+rl.reward.kwargs.marker={marker}"]) == 0, capsys.readouterr().err
    pids = (tmp_path / "spun.calls").read_text().split()
    assert marker.read_text() == str(os.getpid()) and len(pids) == 15
    assert str(os.getpid()) not in pids  # scored in the worker
    step = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert " reward_errors 1/16 " in step[0], step
    said = [r.getMessage() for r in caplog.records if "overran" in r.getMessage()]
    assert len(said) == 1 and "rl.reward.isolate=true" in said[0], said


def test_an_isolated_reward_sees_only_the_variables_passed_through(tmp_path, capsys, monkeypatch):
    """Issue 61 item 8 from the command line: a key the reward reads at import is not in the
    isolated worker's environment unless rl.reward.env_passthrough names it."""
    (tmp_path / "judge.py").write_text(
        "import os\nKEY = os.environ['JUDGE_API_KEY']\n\ndef score(p, c, r):\n    return 1.0\n"
    )
    monkeypatch.setenv("JUDGE_API_KEY", "k")
    reached = []
    monkeypatch.setattr(train_cli, "_run_or_lost_rank", lambda *a: reached.append(1) or 0)
    argv = [
        "preset=tiny",
        f"run_dir={tmp_path}/run",
        f"rl.reward.function={tmp_path}/judge.py:score",
    ]
    argv.append("rl.reward.isolate=true")
    assert main(argv) == 2 and not reached  # in-process it would import: the worker cannot
    line = _one_line(capsys.readouterr().err)
    assert "raised KeyError: 'JUDGE_API_KEY'" in line and "rl.reward.env_passthrough" in line
    assert main([*argv, "rl.reward.env_passthrough=[JUDGE_API_KEY]"]) == 0 and reached
