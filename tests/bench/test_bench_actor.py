"""`sparrow-bench actor`: the batch it builds, and the memory measurement's JSON line."""

import json

import torch

from sparrow.bench import cli
from sparrow.bench.actor import grouped_batch


def test_grouped_batch_shares_the_prefix_and_each_groups_prompt():
    batch = grouped_batch(groups=3, group_size=2, prefix=5, prompt=8, completion=4, vocab=50)
    ids = batch["input_ids"]  # (6, 12)
    assert ids.shape == (6, 12)
    assert torch.equal(ids[:, :5], ids[:1, :5].expand(6, -1))  # the prefix common to all
    assert torch.equal(ids[0, :8], ids[1, :8]) and not torch.equal(ids[1, :8], ids[2, :8])
    assert batch["group_ids"].tolist() == [0, 0, 1, 1, 2, 2]
    assert batch["completion_mask"].sum(1).tolist() == [4] * 6
    assert (batch["prompt_lens"] == 8).all()


def test_memory_prints_the_rss_growth_beside_the_estimate(capsys):
    assert cli.main(["actor", "memory", "2", "0"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["micro_batch_rows"] == [2] and row["max_tokens_per_micro_batch"] == 0
    assert row["peak_rss_growth_mib"] >= 0 and row["estimate_mib"] > 0
