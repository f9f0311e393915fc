"""Time of the dense actor's log-prob pass and update with share_prefix on vs off, side by side
in one process, over a batch shaped like the few-shot default task:

    python tests/rl/shared_prefix_ratio.py [--repeats N] [--micro-batch-size M] [--tiny]

8 GRPO groups of 6 rows; 258-token prompts sharing their first 230 tokens (chat template and
worked examples), 25-token completions; the embedded SmolLM2-135M (or a tiny Qwen3 with --tiny),
fp32, ZeRO-0 (conf/actor/cpu.yaml). Both actors start from the same weights; each repeat times
compute_logprobs then train_step on one actor, then on the other, alternating which goes first.
Prints one JSON line: per pass the median seconds off and on and their ratio (off / on).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny_lm import pg_loss_fn  # noqa: E402

from sparrow.models.loading import ModelConfig, load_model  # noqa: E402
from sparrow.rl.actor import ActorConfig, DenseActor  # noqa: E402

GROUPS, GROUP_SIZE, PREFIX, PROMPT, COMPLETION = 8, 6, 230, 258, 25


def few_shot_batch(vocab: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(1, vocab, (PREFIX,), generator=gen)
    rows = GROUPS * GROUP_SIZE
    own = torch.randint(1, vocab, (GROUPS, PROMPT - PREFIX), generator=gen)  # (G, P - S)
    prompts = torch.cat([prefix.expand(GROUPS, -1), own], 1).repeat_interleave(GROUP_SIZE, 0)
    completions = torch.randint(1, vocab, (rows, COMPLETION), generator=gen)  # (B, C)
    ids = torch.cat([prompts, completions], 1)  # (B, P + C)
    completion_mask = torch.zeros_like(ids, dtype=torch.bool)
    completion_mask[:, PROMPT:] = True
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids, dtype=torch.bool),
        "completion_mask": completion_mask,
        "advantages": torch.randn(rows, generator=gen),  # (B,)
        "prompt_lens": torch.full((rows,), PROMPT),  # (B,)
        "group_ids": torch.arange(GROUPS).repeat_interleave(GROUP_SIZE),  # (B,)
    }


def time_passes(actor: DenseActor, batch: dict) -> tuple[float, float]:
    start = time.perf_counter()
    actor.compute_logprobs(
        batch["input_ids"], batch["attention_mask"], topk=20,
        prompt_lens=batch["prompt_lens"], group_ids=batch["group_ids"],
    )  # fmt: skip
    middle = time.perf_counter()
    loss_fn = pg_loss_fn(int(batch["completion_mask"].sum()))
    actor.train_step(actor.micro_batches(batch), loss_fn)
    return middle - start, time.perf_counter() - middle


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--micro-batch-size", type=int, default=16)  # conf/actor/cpu.yaml
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    name = "tiny-qwen3" if args.tiny else "smollm2-135m-instruct"
    actors = {}
    for share_prefix in (False, True):
        model = load_model(ModelConfig(name)).model
        cfg = ActorConfig(
            zero_stage=0, precision="fp32", lr=1e-5, micro_batch_size=args.micro_batch_size,
            share_prompts=True, share_prefix=share_prefix,
        )  # fmt: skip
        actors[share_prefix] = DenseActor(model, cfg)
    batch = few_shot_batch(actors[True].model.config.vocab_size)
    warmup = {k: v[:GROUP_SIZE] for k, v in batch.items()}  # first calls' one-off costs
    for actor in actors.values():
        time_passes(actor, warmup)
    times = {share: ([], []) for share in actors}
    for repeat in range(args.repeats):
        for share in (False, True) if repeat % 2 == 0 else (True, False):
            logprob_s, train_s = time_passes(actors[share], batch)
            times[share][0].append(logprob_s)
            times[share][1].append(train_s)
    result = {"model": name, "micro_batch_size": args.micro_batch_size, "n": args.repeats}
    for i, name in enumerate(("compute_logprobs", "train_step")):
        off, on = (statistics.median(times[share][i]) for share in (False, True))
        result[name] = {"off_s": round(off, 2), "on_s": round(on, 2), "ratio": round(off / on, 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
