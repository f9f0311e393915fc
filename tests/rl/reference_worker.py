"""Worker for tests/rl/test_reference_zero3.py, under torchrun: the KL reference placed like a
ZeRO-3 actor, against an unpartitioned copy of the same initial weights.

Every rank scores its own micro-batch (rank r: 2 rows of 12 + 28 r positions, lm_head chunks of
8 tokens, so the ranks need different chunk counts) with the partitioned reference and the full
copy, and saves the log-probs of both and the parameter elements it holds to --out/rank{r}.pt.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for tiny_lm
from tiny_lm import rl_batch, tiny_causal_lm  # noqa: E402

from sparrow.rl.actor import DenseActor  # noqa: E402
from sparrow.rl.actor_config import ActorConfig  # noqa: E402
from sparrow.rl.reference import ReferencePolicy  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cfg = ActorConfig(zero_stage=3, precision="fp32", micro_batch_size=2, logprob_chunk_tokens=8)
    model = tiny_causal_lm("llama", seed=0)
    full = ReferencePolicy(model, cfg)  # never placed: every element on this rank
    reference = ReferencePolicy(model, cfg)
    actor = DenseActor(model, cfg)
    reference.place(actor)
    rank = actor.rank
    batch = rl_batch(2, 12 + 28 * rank, seed=rank)
    mb = {k: batch[k] for k in ("input_ids", "attention_mask")}
    params = list(reference.policy.module.parameters())
    result = {
        "partitioned": reference.token_logprobs(mb, temperature=0.7),
        "full": full.token_logprobs(mb, temperature=0.7),
        "held": sum(p.ds_tensor.numel() for p in params),  # this rank's shard
        "whole": sum(p.ds_numel for p in params),
        "local_data": sum(p.data.numel() for p in params),  # released after the forward
        "mask": mb["attention_mask"],
    }
    torch.save(result, args.out / f"rank{rank}.pt")
    dist.barrier()


if __name__ == "__main__":
    main()
