"""The KL reference under ZeRO-3 on 2 CPU ranks (gloo): partitioned like the actor (each rank
holds half of its elements), and its log-probs equal an unpartitioned copy's, with the ranks
scoring different lengths (different lm_head chunk counts: the gathers must still pair up)."""

import sys

import pytest
import torch
from test_distributed import REPO, clean_env, free_port, run

WORKER = REPO / "tests" / "rl" / "reference_worker.py"


def test_zero3_reference_is_partitioned_and_scores_like_a_full_copy(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    cmd += ["--master_port", str(free_port()), str(WORKER), "--out", str(tmp_path)]
    run(cmd, clean_env())
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    whole = ranks[0]["whole"]
    assert whole > 50_000  # the tiny model's elements, counted once (93,248)
    assert sum(r["held"] for r in ranks) == pytest.approx(whole, abs=2 * len(ranks) * 64)
    for r in ranks:
        assert r["held"] <= whole / 2 + 1_000  # a half, not a copy
        assert r["local_data"] == 0  # gathered for the forward, released after it
        scored = r["mask"].clone()
        scored[:, 0] = False
        torch.testing.assert_close(r["partitioned"][scored], r["full"][scored], atol=1e-6, rtol=0)
    assert ranks[0]["mask"].shape[1] != ranks[1]["mask"].shape[1]  # uneven chunk counts
