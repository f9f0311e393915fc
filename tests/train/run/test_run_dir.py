"""A run never clobbers what it did not write (issue 61 item 6): at start-up, before anything is
written, `sparrow-train` refuses in one line (exit 2) a run dir that holds a user's own
metrics.jsonl / run_config.json / policy, a regular file, the root of a source checkout
(`run_dir=.`) and a `policy` that is a file, and leaves them as they were. A new dir, a sparrow
run dir (its run.lock or stored config) and files beside sparrow's (a README, a console log) go
on; `run_dir_reuse=allow` trains over files no sparrow run wrote. Fast: the checks alone, and
sparrow-train refusing before it loads a model. The resume of a real run dir is
tests/train/run/test_stored_config.py's and tests/cli/test_train_cli.py's.
"""

import json
from dataclasses import asdict

import pytest

from sparrow.cli.train import main
from sparrow.train.config import SparrowConfig
from sparrow.train.run import run_dir as run_dir_module
from sparrow.train.run.run_dir import RunDirRefused, check_run_dir

TINY = ["preset=tiny", "rl.steps=1", "rl.eval.every=0"]
HOLDER = {"host": "h", "pid": 1, "started": "2026-01-01T00:00:00+00:00"}  # as run.lock holds it


def _own_files(path):
    """A directory of the user's: their own metrics and config, under sparrow's names."""
    path.mkdir()
    (path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    (path / "run_config.json").write_text('{"lr": 0.1}\n')
    return path


def test_new_empty_and_sparrow_run_dirs_are_accepted(tmp_path):
    check_run_dir(tmp_path / "new" / "run")  # created later by the run
    check_run_dir(tmp_path)  # empty
    locked = tmp_path / "locked"  # a run killed during start-up: its lock and nothing else
    locked.mkdir()
    (locked / "run.lock").write_text(json.dumps(HOLDER))
    (locked / "metrics.jsonl").write_text("")
    check_run_dir(locked)
    stored = tmp_path / "stored"  # a run dir of an older sparrow: no run.lock, its config
    stored.mkdir()
    (stored / "run_config.json").write_text(json.dumps(asdict(SparrowConfig()), default=str))
    (stored / "checkpoints").mkdir()
    (stored / "policy").mkdir()
    check_run_dir(stored)
    beside = tmp_path / "beside"  # files that are not sparrow's names are never touched
    beside.mkdir()
    (beside / "console.log").write_text("a study's log\n")
    (beside / "README.md").write_text("notes\n")
    check_run_dir(beside)


def test_files_no_sparrow_run_wrote_are_refused_unless_allowed(tmp_path):
    own = _own_files(tmp_path / "own")
    with pytest.raises(RunDirRefused) as refused:
        check_run_dir(own)
    assert str(refused.value) == (
        f"run_dir={own} holds run_config.json, metrics.jsonl, which no sparrow run wrote (no "
        "sparrow run.lock or run_config.json there) and a run would overwrite: choose another "
        "run_dir, or run_dir_reuse=allow to train there anyway"
    )
    check_run_dir(own, "allow")
    (own / "run.lock").write_text('{"mine": true}')  # a lock file of something else's
    with pytest.raises(RunDirRefused, match="holds run.lock, run_config.json, metrics.jsonl,"):
        check_run_dir(own)


def test_a_regular_file_and_a_checkout_are_refused_even_when_allowed(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for path, expected in [
        (afile, f"run_dir={afile} is a file, not a directory"),
        (afile / "sub", f"run_dir={afile / 'sub'}: {afile} is a file, not a directory"),
    ]:
        with pytest.raises(RunDirRefused, match=expected):
            check_run_dir(path, "allow")
    for marker in (".git", "pyproject.toml", "setup.py"):
        checkout = tmp_path / f"checkout{marker}"
        checkout.mkdir()
        (checkout / marker).touch()
        with pytest.raises(RunDirRefused, match=f"is a source checkout \\(it holds {marker}\\)"):
            check_run_dir(checkout, "allow")


@pytest.mark.parametrize(
    "name, make, expected",
    [
        ("policy", "file", "policy is a file, where the run writes its policy directory"),
        ("policy.tmp", "file", "policy.tmp is a file, where the run writes its policy.tmp dir"),
        ("metrics.jsonl", "dir", "metrics.jsonl is a directory, where the run writes its metrics"),
    ],
)
def test_a_name_the_run_writes_of_the_other_kind_is_refused(tmp_path, name, make, expected):
    (tmp_path / "run.lock").write_text(json.dumps(HOLDER))  # a sparrow run dir
    if make == "file":
        (tmp_path / name).write_text("x")
    else:
        (tmp_path / name).mkdir()
    with pytest.raises(RunDirRefused, match=expected):
        check_run_dir(tmp_path)


def test_a_policy_the_export_cannot_replace_is_refused(tmp_path, monkeypatch):
    """Permission bits do not bind root (this suite may run as root): os.access says no."""
    (tmp_path / "run.lock").write_text(json.dumps(HOLDER))
    (tmp_path / "policy").mkdir()
    policy = str(tmp_path / "policy")
    real = run_dir_module.os.access
    monkeypatch.setattr(run_dir_module.os, "access", lambda p, m: str(p) != policy and real(p, m))
    with pytest.raises(RunDirRefused, match=f"cannot write {policy} \\(permission denied\\)"):
        check_run_dir(tmp_path)


def _refused(capsys, argv: list[str]) -> str:
    assert main([*TINY, *argv]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith("sparrow-train:")]
    assert "Traceback" not in err and len(lines) == 1 and err.rstrip().endswith(lines[0]), err
    return lines[0]


def test_train_refuses_at_start_up_and_leaves_the_files_as_they_were(capsys, tmp_path, monkeypatch):
    own = _own_files(tmp_path / "own")
    before = {p.name: p.read_text() for p in own.iterdir()}
    line = _refused(capsys, [f"run_dir={own}"])
    assert line.startswith(f"sparrow-train: error: run_dir={own} holds run_config.json, metrics")
    assert {p.name: p.read_text() for p in own.iterdir()} == before  # no run.lock either
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    assert "is a file, not a directory" in _refused(capsys, [f"run_dir={afile}"])
    assert afile.read_text() == "mine\n"
    sparrow_dir = tmp_path / "run"  # a sparrow run dir with a file where policy/ goes
    sparrow_dir.mkdir()
    (sparrow_dir / "run.lock").write_text(json.dumps(HOLDER))
    (sparrow_dir / "policy").write_text("mine\n")
    assert f"{sparrow_dir / 'policy'} is a file" in _refused(capsys, [f"run_dir={sparrow_dir}"])
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text("[project]\n")
    monkeypatch.chdir(checkout)
    assert "run_dir=. is a source checkout" in _refused(capsys, ["run_dir=."])
    assert sorted(p.name for p in checkout.iterdir()) == ["pyproject.toml"]


def test_run_dir_reuse_takes_refuse_or_allow(capsys, tmp_path):
    line = _refused(capsys, [f"run_dir={tmp_path}", "run_dir_reuse=yes"])
    assert "config error: run_dir_reuse='yes': expected refuse or allow" in line
