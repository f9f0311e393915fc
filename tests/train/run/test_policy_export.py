"""The trained policy is written into `policy.tmp/` and renamed: a stop in the middle (here an
`Interrupted` between the weights and the tokenizer) leaves the previous `policy/` as it was
and no temporary directory; a complete export replaces it."""

import signal

import pytest

from sparrow.train.run.policy_export import export_policy
from sparrow.train.run.stop_outside_loop import Interrupted


class _Actor:
    """Writes the weights, then (like a tokenizer save) a second file; can fail in between."""

    def __init__(self, fail: BaseException | None = None):
        self.fail = fail

    def export_hf(self, directory, tokenizer=None):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "model.safetensors").write_text("new weights")
        if self.fail is not None:
            raise self.fail
        (directory / "tokenizer.json").write_text("{}")


def test_export_replaces_the_policy_only_when_it_is_complete(tmp_path):
    final = tmp_path / "policy"
    final.mkdir()
    (final / "model.safetensors").write_text("old weights")
    (tmp_path / "policy.tmp").mkdir()  # a killed export's leftover

    with pytest.raises(Interrupted):
        export_policy(_Actor(Interrupted(signal.SIGTERM)), None, final, 3, rank=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]  # no policy.tmp
    assert (final / "model.safetensors").read_text() == "old weights"

    export_policy(_Actor(), None, final, 3, rank=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]
    assert sorted(p.name for p in final.iterdir()) == ["model.safetensors", "tokenizer.json"]
    assert (final / "model.safetensors").read_text() == "new weights"
