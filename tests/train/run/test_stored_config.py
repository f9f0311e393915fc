"""A run dir remembers its resolved config; resuming it with a run-changing difference stops.

Fast: which keys count (model, data, batch shape, optimizer, loss; not rl.steps, evaluation or
logging) and the one-line refusal with its override. Slow: a real `sparrow-train preset=tiny`
resumed with another group size and another model (exit 2, one line listing the keys), then with
`resume_mismatch=allow` (resumes).
"""

import json
from dataclasses import asdict, replace

import pytest

from sparrow.cli.train import main
from sparrow.train.config import SparrowConfig

TINY = ["preset=tiny", "rl.eval.every=0", "rl.save_every=1"]


def test_only_run_changing_keys_differ():
    from sparrow.train.run.stored_config import differing_keys

    base = SparrowConfig()
    changed = replace(
        base,
        rl=replace(base.rl, group_size=3, steps=99, save_every=5),
        model=replace(base.model, name="tiny-llama"),
        run_dir="elsewhere",
    )
    diffs = differing_keys(asdict(base), asdict(changed))
    assert [d.split(":")[0] for d in diffs] == ["model.name", "rl.group_size"]
    assert diffs[1] == "rl.group_size: 8 -> 3"


def test_a_key_newer_than_the_stored_config_differs_only_off_its_default():
    """A run dir written before a key existed (e.g. data.answer_extractor) resumes while the key
    is at the schema's default, and is refused once it is set to anything else."""
    from sparrow.train.run.stored_config import differing_keys

    defaults = asdict(SparrowConfig())
    older = asdict(SparrowConfig())
    del older["data"]["answer_extractor"]
    assert differing_keys(older, defaults, defaults) == []
    assert differing_keys(older, defaults) == ["data.answer_extractor: None -> 'none'"]
    boxed = asdict(SparrowConfig())
    boxed["data"]["answer_extractor"] = "boxed"
    assert differing_keys(older, boxed, defaults) == ["data.answer_extractor: None -> 'boxed'"]


def test_resume_with_another_config_is_refused_unless_allowed(tmp_path):
    from sparrow.train.run.stored_config import (
        FILE_NAME,
        ResumeMismatch,
        check_resume,
        save_run_config,
    )

    base = SparrowConfig()
    save_run_config(tmp_path, asdict(base))
    assert json.loads((tmp_path / FILE_NAME).read_text())["rl"]["group_size"] == 8
    other = asdict(replace(base, actor=replace(base.actor, lr=3e-4)))
    with pytest.raises(ResumeMismatch) as caught:
        check_resume(tmp_path, other, allow=False, checkpoint=tmp_path / "step_000004")
    message = str(caught.value)
    assert "actor.lr: 1e-06 -> 0.0003" in message and "resume_mismatch=allow" in message
    check_resume(tmp_path, other, allow=True, checkpoint=tmp_path / "step_000004")
    check_resume(tmp_path, asdict(base), allow=False, checkpoint=tmp_path / "step_000004")


@pytest.mark.slow
def test_cli_refuses_a_changed_resume_in_one_line(capsys, tmp_path):
    run = [f"run_dir={tmp_path}"]
    assert main([*TINY, *run, "rl.steps=1"]) == 0
    capsys.readouterr()
    for override, key in [
        ("rl.group_size=2", "rl.group_size: 4 -> 2"),
        ("model=tiny_llama", "model.name: 'tiny-qwen3' -> 'tiny-llama'"),
    ]:
        assert main([*TINY, *run, "rl.steps=2", override]) == 2
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("sparrow-train:")]
        assert len(lines) == 1 and "Traceback" not in err, err
        assert key in lines[0] and "resume_mismatch=allow" in lines[0]
    assert main([*TINY, *run, "rl.steps=2", "rl.group_size=2", "resume_mismatch=allow"]) == 0
    assert f"resumed from {tmp_path / 'checkpoints' / 'step_000001'}" in capsys.readouterr().out


def test_the_staleness_changes_the_run():
    """A run resumed at another rl.async.staleness would train fresh rows where the first one
    trained stale ones (and leave the checkpoint's drawn next step unused): refused by default."""
    from sparrow.train.config import AsyncConfig
    from sparrow.train.run.stored_config import differing_keys

    base = SparrowConfig()
    stale = replace(base, rl=replace(base.rl, async_rollout=AsyncConfig(staleness=1)))
    assert differing_keys(asdict(base), asdict(stale)) == ["rl.async_rollout.staleness: 0 -> 1"]


def test_local_paths_are_stored_absolute_and_an_older_relative_one_still_resumes(
    tmp_path, monkeypatch
):
    """The CLI stores a relative reward file or data file resolved (sparrow-eval reads the run dir
    from anywhere); a module reward, a hub dataset or a missing file (its error names it as typed)
    is left as it is; a run dir stored with the relative form resumes from the directory it
    meant."""
    from sparrow.cli.config_loader import load_config
    from sparrow.train.run.stored_config import differing_keys

    (tmp_path / "r.py").write_text("def score(prompt, completion, reference):\n    return 0.0\n")
    (tmp_path / "d.jsonl").write_text('{"prompt": "1 + 1?", "answer": "2"}\n')
    monkeypatch.chdir(tmp_path)
    relative = ["data=jsonl", "data.source=d.jsonl", "rl.reward.function=r.py:score"]
    cfg = load_config([*relative, "data.eval_source=openai/gsm8k"])
    assert cfg.rl.reward.function == f"{tmp_path}/r.py:score"
    assert (cfg.data.source, cfg.data.eval_source) == (f"{tmp_path}/d.jsonl", "openai/gsm8k")
    for kept in ("my_pkg.rewards:score", "missing.py:score"):  # a missing file: as typed
        assert load_config([f"rl.reward.function={kept}"]).rl.reward.function == kept
    older = asdict(cfg)
    older["data"]["source"], older["rl"]["reward"]["function"] = "d.jsonl", "r.py:score"
    assert differing_keys(older, asdict(cfg)) == []
    monkeypatch.chdir(tmp_path.parent)  # the same relative names now mean other files
    assert [d.split(":")[0] for d in differing_keys(older, asdict(cfg))] == [
        "data.source",
        "rl.reward.function",
    ]
