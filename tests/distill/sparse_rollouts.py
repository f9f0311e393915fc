"""Tiny engines with sparse rollouts for the DistillSparse tests.

Pages of 4 tokens, a budget of 4 pages and only layer 0 dense, so that 9-20-token prompts with
40 sampled tokens drop most pages in the sparse layers. Large random weights (init range 0.2)
make attention depend on which pages are kept (the default init nearly ignores context).
"""

from dataclasses import dataclass

import torch
import transformers
from tiny_lm import random_biases

from sparrow.models.loading import tiny_model_config
from sparrow.rl.batch import RolloutBatch, collate_rollouts
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams

BUDGET_PAGES = 4


@dataclass
class SparseRollout:
    model: transformers.PreTrainedModel
    engine: LLMEngine
    batch: RolloutBatch


def make_rollout(tokenizer, family: str, score: str = "quest", seed: int = 0) -> SparseRollout:
    config = tiny_model_config(family, vocab_size=len(tokenizer))
    config.initializer_range = 0.2
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = random_biases(transformers.AutoModelForCausalLM.from_config(config).eval())
    cfg = EngineConfig(page_size=4, num_pages=512, score=score, dense_layers=(0,), seed=seed)
    engine = LLMEngine(model, tokenizer, cfg, schedule=lambda context: BUDGET_PAGES)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, len(tokenizer), (n,), generator=g).tolist() for n in (13, 20, 9)]
    params = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True)
    outputs = engine.generate(prompts, params, n=2)
    return SparseRollout(model, engine, collate_rollouts(prompts, outputs, tokenizer.pad_token_id))


def dense_logprobs(model, batch: RolloutBatch) -> torch.Tensor:
    """(B, T) HF dense log-probs of batch.input_ids, aligned as in RolloutBatch (0 at t = 0)."""
    with torch.no_grad():
        logits = model(batch.input_ids).logits.float()  # (B, T, V)
    picked = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None])
    return torch.nn.functional.pad(picked[..., 0], (1, 0)) * batch.completion_mask


def dense_topk(model, batch: RolloutBatch, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, log-probs), each (B, T, K): the HF dense top-K at each position (0 at t = 0), as
    `DenseActor.compute_logprobs` returns them."""
    with torch.no_grad():
        logprobs = torch.log_softmax(model(batch.input_ids).logits.float()[:, :-1], -1)
    values, ids = logprobs.topk(k, dim=-1)  # (B, T - 1, K)
    pad = (0, 0, 1, 0)
    return torch.nn.functional.pad(ids, pad), torch.nn.functional.pad(values, pad)
