"""`env.function` from the command line (issue 62, faults): an environment that cannot be used
(no file, no factory, not callable, a factory that takes no row, an import that raises, an
unknown built-in) is one line on stderr and exit 2 before any model is loaded, in this process
and with env.isolate=true (checked in the worker, never imported by the trainer)."""

import pytest

import sparrow.cli.train as train_cli
from sparrow.cli.train import main


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if the CLI gets past its start-up checks (the model is loaded after)."""

    def loads_the_model(*args, **kwargs):
        pytest.fail("the CLI went on to load the model")

    monkeypatch.setattr(train_cli, "_run_or_lost_rank", loads_the_model)


_BAD = {
    "missing file": (None, "nope.py:make_env", "no such file {tmp}/nope.py"),
    "missing factory": ("def make_nev(row):\n    pass\n", "e.py:make_env", "did you mean"),
    "not callable": ("make_env = 0.5\n", "e.py:make_env", "make_env is a float, not callable"),
    "takes no row": ("def make_env():\n    pass\n", "e.py:make_env", "takes the prompt row"),
    "import error": ("import no_such_package_for_sparrow\n", "e.py:make_env", "ModuleNotFound"),
    "unknown built-in": (None, "calculater", "expected a built-in (calculator, python)"),
}


@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.parametrize("case", sorted(_BAD))
def test_an_env_function_that_cannot_be_used_is_one_line_and_exit_2(
    case, isolate, tmp_path, capsys, no_model_load
):
    source, function, expected = _BAD[case]
    if source is not None:
        (tmp_path / "e.py").write_text(source)
    if function.split(":")[0].endswith(".py"):
        function = f"{tmp_path}/{function}"
    argv = ["preset=tiny", f"run_dir={tmp_path}/run", f"env.function={function}"]
    code = main([*argv, f"env.isolate={str(isolate).lower()}"])
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if line]
    assert len(lines) == 1, lines
    assert code == 2, lines
    assert lines[0].startswith(f"sparrow-train: error: env.function='{function}'"), lines
    assert expected.format(tmp=tmp_path) in lines[0], lines
    assert not (tmp_path / "run").exists()  # stopped before the run dir was even claimed
