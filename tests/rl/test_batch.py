"""collate_rollouts: padding, masks, and the alignment rule checked against a dense forward."""

import pytest
import torch
from tiny_lm import random_prompts

from sparrow.rl.batch import collate_rollouts
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams


def test_collated_logprobs_align_with_a_dense_forward(lively_llama):
    engine = LLMEngine(lively_llama.model, lively_llama.tokenizer, EngineConfig(page_size=4))
    prompts = random_prompts(lively_llama.model.config.vocab_size, [5, 9])
    outs = engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=10), n=2)
    outs[1].token_ids = outs[1].token_ids[:4]  # ragged completions, as EOS would leave them
    for name in ("logprobs", "sampling_logprobs", "topk_ids", "topk_logprobs", "budget_pages"):
        setattr(outs[1], name, getattr(outs[1], name)[:4])
    batch = collate_rollouts(prompts, outs, pad_token_id=0)
    assert batch.input_ids.shape == (4, 19) and len(batch) == 4
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    assert batch.prompt_lens.tolist() == [5, 5, 9, 9]
    assert batch.attention_mask.sum(1).tolist() == [15, 9, 19, 19]
    assert batch.completion_mask.sum(1).tolist() == [10, 4, 10, 10]
    assert (batch.input_ids[1, 9:] == 0).all() and not batch.completion_mask[:, :5].any()
    with torch.no_grad():
        logits = lively_llama.model(batch.input_ids, attention_mask=batch.attention_mask).logits
    dense = logits[:, :-1].log_softmax(-1).gather(2, batch.input_ids[:, 1:, None])[..., 0]
    mask = batch.completion_mask[:, 1:]  # token t is predicted from logits at t - 1
    assert torch.allclose(dense[mask], batch.sampled_logprobs[:, 1:][mask], atol=1e-4)
    assert (batch.sampled_logprobs[~batch.completion_mask] == 0).all()
    assert batch.behaviour_logprobs is None  # no top-p/top-k: drawn from the full distribution
    assert (batch.topk_ids[batch.completion_mask][:, 0] >= 0).all()
    assert (batch.budget_pages[batch.completion_mask] > 0).all()
    assert batch.finish_reasons == [o.finish_reason for o in outs]
    regrouped = collate_rollouts(prompts, outs, 0, group_ids=[7, 7, 8, 8])
    assert regrouped.group_ids.tolist() == [7, 7, 8, 8]
    with pytest.raises(ValueError, match="another prompt"):
        collate_rollouts(prompts[::-1], outs, 0)
