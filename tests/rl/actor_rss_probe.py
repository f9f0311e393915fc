"""Peak RSS of one actor update over a single GRPO group, run in its own process:

    python tests/rl/actor_rss_probe.py GROUP MAX_TOKENS [--checkpointing]

Prints one JSON line: the group size, the micro-batch row counts, and the growth of the peak RSS
(ru_maxrss) over the update, in MiB. A tiny Qwen3 (hidden 256, 4 layers) scores rows of a
64-token prompt and 1024 completion tokens; MAX_TOKENS 0 keeps the group whole in one
micro-batch (share_prompts), as the actor did before token budgets.
"""

import json
import resource
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

sys.path.insert(0, str(Path(__file__).parent))
from tiny_lm import VOCAB, pg_loss_fn  # noqa: E402

from sparrow.rl.actor import ActorConfig, DenseActor  # noqa: E402

PROMPT, COMPLETION = 64, 1024


def main() -> None:
    group, max_tokens = int(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config).eval()
    cfg = ActorConfig(
        zero_stage=0, precision="fp32", micro_batch_size=group, share_prompts=True,
        max_tokens_per_micro_batch=max_tokens,
        activation_checkpointing="--checkpointing" in sys.argv,
    )  # fmt: skip
    actor = DenseActor(model, cfg)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, VOCAB, (PROMPT,), generator=gen)
    ids = torch.cat(
        [prompt.expand(group, PROMPT), torch.randint(1, VOCAB, (group, COMPLETION), generator=gen)],
        dim=1,
    )  # (G, P + C)
    completion = torch.zeros_like(ids, dtype=torch.bool)
    completion[:, PROMPT:] = True
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids, dtype=torch.bool),
        "completion_mask": completion,
        "advantages": torch.randn(group, generator=gen),
        "prompt_lens": torch.full((group,), PROMPT),
        "group_ids": torch.zeros(group, dtype=torch.int64),
    }
    micro_batches = actor.micro_batches(batch)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    actor.train_step(micro_batches, pg_loss_fn(int(completion.sum())))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "group": group,
                "max_tokens_per_micro_batch": max_tokens,
                "checkpointing": cfg.activation_checkpointing,
                "micro_batch_rows": [len(mb["input_ids"]) for mb in micro_batches],
                "peak_rss_growth_mib": round((peak - before) / 1024, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
