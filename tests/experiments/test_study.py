"""sparrow.experiments.study: what a declared study's command makes of its flags, run by --report
and --status so that nothing trains: the runs (seed-major, the arms in their declared order, an
extra arm only behind its flag, no seed for a study without seeds), a size's overrides and
folders, the overrides in the order that lets later ones win, and bad input refused."""

import pytest

from sparrow.experiments import stability_study
from sparrow.experiments.study import Arm, Size, Study, study_main
from sparrow.experiments.study_files import REPO

ARMS = (
    Arm("a", ("schedule.mode=dense",), "arm a"),
    Arm("b", (), "arm b"),
    Arm("x", ("controller.tau=0.80",), "an extra arm", flag="extra"),
)
SIZES = (Size("small", ("rl.steps=3",), "3 steps"), Size("large", ("rl.steps=9",), "9 steps"))


def _probe(**fields) -> tuple[Study, dict]:
    """A study whose report keeps what it was given."""
    seen: dict = {}
    study = Study(
        name="probe",
        doc="A probe study.\n",
        arms=ARMS,
        report=lambda inv, steps: seen.update(inv=inv, steps=steps),
        **fields,
    )
    return study, seen


def test_the_report_gets_the_runs_folders_and_overrides():
    study, seen = _probe(preset="tiny", sizes=SIZES)
    argv = ["--small", "--report", "--seeds", "1,0", "--arms", "b,a", "--", "rl.eval.every=0"]
    assert study_main(study, argv) == 0
    inv = seen["inv"]
    assert (inv.root, inv.docs) == (
        REPO / "runs" / "probe_small",
        REPO / "docs" / "probe" / "small",
    )
    shared = ["logger=disabled", "rollout.progress=false"]
    assert inv.overrides == ["preset=tiny", *shared, "rl.steps=3", "rl.eval.every=0"]
    assert [r.name for r in inv.runs] == ["a_s1", "b_s1", "a_s0", "b_s0"]
    assert inv.runs[0].overrides == ("schedule.mode=dense", "seed=1")
    assert seen["steps"] == {r.name: 3 for r in inv.runs}  # the size's rl.steps reached each run


def test_an_extra_arm_runs_only_behind_its_flag_or_by_name():
    study, seen = _probe()
    assert study_main(study, ["--report", "--seeds", "0"]) == 0
    assert [r.name for r in seen["inv"].runs] == ["a_s0", "b_s0"]
    assert seen["inv"].root == REPO / "runs" / "probe"
    assert study_main(study, ["--report", "--seeds", "0", "--extra"]) == 0
    assert [r.name for r in seen["inv"].runs] == ["a_s0", "b_s0", "x_s0"]
    assert study_main(study, ["--report", "--seeds", "0", "--arms", "x"]) == 0
    assert [r.name for r in seen["inv"].runs] == ["x_s0"]


def test_a_study_without_seeds_runs_each_arm_once_unseeded():
    study, seen = _probe(seeds=())
    assert study_main(study, ["--report"]) == 0
    assert [(r.name, r.overrides) for r in seen["inv"].runs] == [
        ("a", ("schedule.mode=dense",)),
        ("b", ()),
    ]


def test_bad_input_is_refused_before_anything_runs(tmp_path, capsys):
    study, seen = _probe(sizes=SIZES)
    root = ["--root", str(tmp_path / "r")]
    assert study_main(study, [*root, "--arms", "a,nope"]) == 2
    assert "unknown arms ['nope']" in capsys.readouterr().err
    assert study_main(study, [*root, "--", "rl.nonexistent=1"]) == 2
    with pytest.raises(SystemExit):  # two sizes at once
        study_main(study, [*root, "--small", "--large"])
    assert not seen and not (tmp_path / "r").exists()


def test_stability_status_of_its_quick_size_with_the_distill_arm(tmp_path, capsys):
    argv = ["--quick", "--distill", "--status", "--root", str(tmp_path / "runs")]
    assert stability_study.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    names = ["dense", "tau092", "tau086", "tau080", "fixed_b8", "tau080_distill"]
    assert [line.split(":")[0] for line in lines] == names
    assert all("incomplete, 0/12 steps logged" in line for line in lines)  # --quick: 12 steps
