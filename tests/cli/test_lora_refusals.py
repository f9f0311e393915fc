"""What LoRA RL (actor.lora) cannot combine with, or a LoRA setting the engine cannot apply: one
line, exit 2, at config load (before any model loads; the load is patched to fail loudly)."""

import pytest

from sparrow.cli.train import main

TINY = ["preset=tiny", "rl.steps=1", "rl.eval.every=0", "actor.lora.rank=8"]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["distill=default", "distill.gate=false"], "actor.lora.rank with distill.gate=false"),
        (["rollout.engine.sleep=weights"], "rollout.engine.sleep=weights with actor.lora.rank"),
        (["actor.lora.dropout=0.1"], "actor.lora.dropout=0.1 is not supported"),
        (["actor.lora.target_modules=lm_head"], "actor.lora.target_modules='lm_head': the engine"),
        (["actor.lora.target_modules='q_proj,embed_tokens'"], "(not embed_tokens)"),
        (["actor.lora.rank=-1"], "actor.lora.rank must be >= 0"),
        (["actor.lora.alpha=0"], "actor.lora.alpha must be > 0"),
    ],
)
def test_refused_in_one_line_before_the_model_loads(
    capsys, monkeypatch, tmp_path, overrides, expected
):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr("sparrow.train.build.load_model", no_load)
    assert main([*TINY, f"run_dir={tmp_path}", *overrides]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [x for x in err.strip().splitlines() if x.startswith("sparrow-train:")]
    assert len(lines) == 1 and err.rstrip().endswith(lines[0]), err
    assert "config error" in lines[0] and expected in lines[0]
