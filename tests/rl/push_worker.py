"""Worker for tests/rl/test_weight_push.py, under torchrun with 2 ranks (gloo, CPU).

`--mode wire`: rank 0 pushes a tiny model's weights (seed 0) bucket by bucket
(sparrow.rl.actor.parameter_buckets -> WeightPush.send) to rank 1, whose engine was built from
another initialisation (seed 1), for each `--bucket-bytes` and both a tied (llama) and an untied
(qwen3) model. Rank 1 compares its engine, weight by weight and by its greedy logits, with an
engine built from the seed-0 model itself, and saves what it found to `--out/wire.pt`.

`--mode zero3`: both ranks hold the same tiny llama in a ZeRO-3 DenseActor (parameter
persistence threshold 0, so every parameter is partitioned) and draw `weight_buckets` for each
`--bucket-bytes`; at every bucket each rank sums the bytes of all parameters that are gathered
(full size) at that moment. Rank 0 saves those sums, the buckets' sizes and weights, and the
actor's own gathered_state_dict to `--out/zero3.pt`.
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for tiny_lm
from tiny_lm import random_prompts, tiny_causal_lm  # noqa: E402

from sparrow.rl.actor import DenseActor, parameter_buckets  # noqa: E402
from sparrow.rl.actor_config import ActorConfig  # noqa: E402
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from sparrow.rollout.weight_push import WeightPush  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, return_logits=True)
CPU = torch.device("cpu")


class NoText:
    """The engine decodes each completion's text; these tests read only tokens and logits."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True) -> str:
        return ""


def engine_of(model, dtype: str) -> LLMEngine:
    # fp32 on the packed oneDNN GEMMs: logits from stale packed copies would show a missed repack.
    linear = "onednn" if dtype == "float32" else "torch"
    cfg = EngineConfig(page_size=4, num_pages=64, dtype=dtype, linear_backend=linear)
    return LLMEngine(model, NoText(), cfg)


def engine_weights(engine: LLMEngine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.runner.model._parameter_views().items()}


def greedy_logits(engine: LLMEngine) -> torch.Tensor:
    prompts = random_prompts(engine.runner.model.shape.vocab_size, [5, 9], seed=3)
    return torch.cat([o.logits for o in engine.generate(prompts, GREEDY)])


def wire(args) -> None:
    rank, found = dist.get_rank(), []
    for family in ("llama", "qwen3"):
        for dtype in ("float32", "bfloat16"):
            torch_dtype = getattr(torch, dtype)
            for bucket_bytes in args.bucket_bytes:
                push = WeightPush(None, 0, bucket_bytes, torch_dtype, CPU)
                if rank == 0:
                    model = tiny_causal_lm(family, seed=0)
                    push.send(parameter_buckets(model, bucket_bytes, torch_dtype))
                    continue
                engine = engine_of(tiny_causal_lm(family, seed=1), dtype)
                before = engine_weights(engine)
                stats = push.receive(engine)
                reference = engine_of(tiny_causal_lm(family, seed=0), dtype)
                found.append(
                    {
                        "family": family,
                        "dtype": dtype,
                        "bucket_bytes": bucket_bytes,
                        "stats": stats,
                        "before": before,
                        "after": engine_weights(engine),
                        "want": engine_weights(reference),
                        "logits": greedy_logits(engine),
                        "want_logits": greedy_logits(reference),
                        "largest_tensor_bytes": max(
                            p.numel() * torch_dtype.itemsize
                            for p in tiny_causal_lm(family, seed=0).parameters()
                        ),
                        "unique_bytes": sum(
                            p.numel() * torch_dtype.itemsize
                            for p in tiny_causal_lm(family, seed=0).parameters()
                        ),
                    }
                )
    if rank == 1:
        torch.save(found, args.out / "wire.pt")


class FullyPartitioned(DenseActor):
    """ZeRO-3 with no parameter kept whole on every rank (the tiny model's are all small)."""

    def _deepspeed_config(self):
        config = super()._deepspeed_config()
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        return config


def gathered_bytes(model: torch.nn.Module) -> int:
    """Bytes of the partitioned parameters that are whole on this rank right now."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if hasattr(p, "ds_id"))


def zero3(args) -> None:
    cfg = ActorConfig(zero_stage=3, lr=1e-3, micro_batch_size=2, precision="fp32")
    actor = FullyPartitioned(tiny_causal_lm("llama", seed=0), cfg)
    idle = gathered_bytes(actor.model)
    result = {"idle_gathered": idle, "runs": []}
    for bucket_bytes in args.bucket_bytes:
        gathered, sizes, counts, weights = [], [], [], {}
        for bucket in actor.weight_buckets(bucket_bytes, torch.float32):
            gathered.append(gathered_bytes(actor.model))
            sizes.append(sum(t.numel() * t.element_size() for _, t in bucket))
            counts.append(len(bucket))
            weights |= {name: t.clone() for name, t in bucket}
        run = {"bucket_bytes": bucket_bytes, "gathered": gathered, "sizes": sizes}
        result["runs"].append(run | {"counts": counts, "weights": weights})
    result["full"] = {k: v.clone() for k, v in actor.gathered_state_dict().items()}
    result["largest_tensor_bytes"] = max(p.ds_numel * 4 for p in actor.model.parameters())
    if actor.rank == 0:
        torch.save(result, args.out / "zero3.pt")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["wire", "zero3"], required=True)
    parser.add_argument("--bucket-bytes", type=int, nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.mode == "wire":
        dist.init_process_group("gloo")
        wire(args)
    else:
        zero3(args)
    dist.barrier()


if __name__ == "__main__":
    main()
