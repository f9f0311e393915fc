"""An override Hydra cannot parse because its value was not quoted is one line that shows the
quoting which works (exit 2): a run dir with spaces that the shell split into several arguments,
or a value with characters Hydra's grammar reserves. The line's example is checked by giving it
back to the shell's word splitting and to Hydra: it must compose to the value meant. Config load
only: no model is loaded."""

import shlex

import pytest

from sparrow.cli.config_loader import compose_dict
from sparrow.cli.train import main


def _one_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize(
    "argv, meant",
    [
        # The command lines as the shell splits them, unquoted.
        (shlex.split("run_dir=/tmp/my runs/x"), "/tmp/my runs/x"),
        (shlex.split("run_dir=/tmp/a b c rl.steps=2"), "/tmp/a b c"),
        # One argument (quoted for the shell only) with characters Hydra's lexer refuses.
        (["run_dir=/tmp/my runs/a!b"], "/tmp/my runs/a!b"),
        (['run_dir=/tmp/it\'s a "run"/x&y\\'], '/tmp/it\'s a "run"/x&y\\'),
    ],
)
def test_unquoted_value_says_how_to_quote_it(capsys, argv, meant):
    line = _one_line(capsys, ["preset=tiny", *argv])
    assert line.startswith("sparrow-train: config error: cannot parse override "), line
    assert "must be quoted for the shell and for Hydra, e.g. " in line, line
    example = shlex.split(line.split(", e.g. ", 1)[1])
    assert len(example) == 1 and example[0].startswith("run_dir="), example
    assert compose_dict(["preset=tiny", *example]).run_dir == meant


def test_a_key_without_a_value_keeps_hydras_message(capsys):
    """`rl.steps` alone names a key: a forgotten `=value`, not a split one."""
    line = _one_line(capsys, ["preset=tiny", "rl.steps"])
    assert "Error parsing override 'rl.steps'" in line and "quoted" not in line, line
