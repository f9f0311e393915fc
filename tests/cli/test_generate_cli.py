"""sparrow-generate end to end on a tiny model: file prompts in, per-token JSONL out."""

import json

from sparrow.cli.generate import main


def test_generate_cli_writes_one_row_per_sample(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"q": "What is 2 + 3?"}\n{"q": "hello"}\n')
    out = tmp_path / "out.jsonl"
    argv = ["--model", "tiny-llama", "--prompts", str(prompts), "--column", "q", "--n", "2"]
    argv += ["--max-tokens", "6", "--budget-tokens", "48", "--topk", "3", "--out", str(out)]
    assert main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    for r in rows:
        t = len(r["token_ids"])
        assert 1 <= t <= 6 and r["answer"] is None and "What is 2 + 3?" in rows[0]["prompt"]
        assert len(r["logprobs"]) == len(r["budget_pages"]) == len(r["context_lens"]) == t
        assert len(r["topk_ids"]) == t and len(r["topk_ids"][0]) == 3
        assert all(lp <= 0 for lp in r["logprobs"])


def test_generate_cli_rejects_bad_input(tmp_path):
    out = str(tmp_path / "out.jsonl")
    missing = ["--model", "tiny-llama", "--prompts", str(tmp_path / "nope.jsonl"), "--out", out]
    assert main(missing) == 2
    both = ["--model", "tiny-llama", "--budget-tokens", "64", "--schedule", "x.yaml", "--out", out]
    assert main(both) == 2
