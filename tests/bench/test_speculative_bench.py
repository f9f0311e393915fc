"""`sparrow-bench speculative` exits 1, naming what it skipped, when a context's run did not do
the work its ratios would describe (docs/speculative/README.md reads them as measured): here a
draft budget that covers the whole context, so the "sparse" arm and the drafts read every page.
The run that does its work exits 0 in tests/bench/test_every_subcommand.py."""

import json

from sparrow.bench import cli

TINY = "speculative --model tiny-qwen3 --contexts 96 --batch 2 --new-tokens 6 --repeats 1"


def test_a_budget_that_covers_the_context_fails_the_bench(tmp_path, capsys):
    path = tmp_path / "spec.json"
    argv = f"{TINY} --budget-tokens 256 --draft-tokens 2 --json {path}".split()
    code = cli.main(argv)
    out = capsys.readouterr().out
    assert code == 1, out[-2000:]
    problems = json.loads(path.read_text())["contexts"][0]["problems"]
    assert [p.split(":")[0] for p in problems] == ["sparse", "spec_k2"], problems
    assert all("nothing was sparse" in p for p in problems), problems
    assert "error: context" in out
