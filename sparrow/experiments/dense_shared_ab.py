"""Dense decode of samples of one prompt: shared pages through the fused kernel (the engine's
choice since cfbbe83) against per-row contiguous copies (forced), alternating in one process.

    python -m sparrow.experiments.dense_shared_ab --context 2458 --samples 4 \
        --new-tokens 256 --rounds 5
    python -m sparrow.experiments.dense_shared_ab --context 4096 --samples 8 \
        --new-tokens 128 --rounds 4

Prints decode tokens/s per round for each path (SmolLM2, fp32, random prompt tokens, T = 1).
Only the ratio within one run means anything on a shared VM.
"""

import argparse

import torch

from sparrow.models.loading import ModelConfig, load_model
from sparrow.rollout import paged_attention
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=2458, help="prompt tokens")
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model(ModelConfig())
    cfg = EngineConfig(num_pages=4096, linear_backend="onednn")
    engine = LLMEngine(lm.model, lm.tokenizer, cfg)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, lm.model.config.vocab_size, (args.context,), generator=gen)
    params = SamplingParams(temperature=1.0, max_tokens=args.new_tokens, ignore_eos=True)

    kernel_path = paged_attention.PagedKVCache.decode_attention

    def copies_path(self, layer, q, k, v, meta):
        meta.shared_pages = False  # as if the rows shared nothing: per-row copies + SDPA
        return kernel_path(self, layer, q, k, v, meta)

    rates: dict[str, list[float]] = {"kernel": [], "copies": []}
    for _ in range(args.rounds):
        for name, path in (("kernel", kernel_path), ("copies", copies_path)):
            paged_attention.PagedKVCache.decode_attention = path
            engine.generate([prompt.tolist()], params, n=args.samples)
            rates[name].append(engine.last_stats.decode_tok_s)
            print(f"{name:7s} {rates[name][-1]:6.1f} decode tok/s", flush=True)
    paged_attention.PagedKVCache.decode_attention = kernel_path
    for name, values in rates.items():
        print(f"{name}: " + " ".join(f"{x:.1f}" for x in values))


if __name__ == "__main__":
    main()
