"""The gated sparse policy runs the prompt prefix its rows share once (SparsePolicy.shared_prefix):
the same log-probs, top-K log-probs and adapter gradient as the full forward per row, over fewer
decoder tokens, and the same DistillSparse step, with each micro-batch's own prefix (a GRPO
group's whole prompt) extended from the batch's."""

from dataclasses import replace

import pytest
import torch
from sparse_rollouts import dense_logprobs, dense_topk
from test_gated_adapter import TOLERANCE, _gated

from sparrow.models.loading import tiny_model_config
from sparrow.rl.batch import collate_rollouts
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams


class _Rollout:
    def __init__(self, model, engine, batch):
        self.model, self.engine, self.batch = model, engine, batch


def _prefixed_rollout(tokenizer, family: str):
    """Three prompts that share a 22-token prefix (a system prompt), 2 samples each, pages of 4
    tokens and a 4-page budget: the completions are decoded sparsely."""
    import transformers

    config = tiny_model_config(family, vocab_size=len(tokenizer))
    config.initializer_range = 0.2  # attention that depends on which pages are kept
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    cfg = EngineConfig(page_size=4, num_pages=512, dense_layers=(0,), seed=0)
    engine = LLMEngine(model, tokenizer, cfg, schedule=lambda context: 4)
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(3, len(tokenizer), (22,), generator=g).tolist()
    own = [torch.randint(3, len(tokenizer), (n,), generator=g).tolist() for n in (3, 9, 5)]
    prompts = [shared + tokens for tokens in own]
    params = SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)
    outputs = engine.generate(prompts, params, n=2)
    return _Rollout(model, engine, collate_rollouts(prompts, outputs, tokenizer.pad_token_id))


def _decoder_tokens(distill) -> list[int]:
    """Tokens the sparse policy's decoder embeds, per call (a hook on its embedding)."""
    fed: list[int] = []
    embed = distill.policy.model.get_decoder().embed_tokens
    embed.register_forward_hook(lambda module, args, out: fed.append(args[0].numel()))
    return fed


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_shared_prefix_gives_the_same_logprobs_and_gradient(tokenizer, family):
    rollout = _prefixed_rollout(tokenizer, family)
    batch = rollout.batch
    ids, _ = dense_topk(rollout.model, batch, 5)
    distill = _gated(rollout)
    policy = distill.policy
    fed = _decoder_tokens(distill)
    prefix = policy.shared_prefix(batch.input_ids, batch.prompt_lens)
    assert prefix.length == 22 and fed == [22]
    results = []
    for shared in (None, prefix):
        for p in policy.parameters():
            p.grad = None
        logprobs, topk = policy.token_logprobs(
            batch.input_ids, batch.completion_mask, batch.budget_pages, 1.0, ids, prefix=shared
        )
        (logprobs.sum() + topk.sum()).backward()
        grads = [p.grad.clone() for p in policy.parameters()]
        results.append((logprobs.detach(), topk.detach(), grads))
    (full, full_k, full_g), (part, part_k, part_g) = results
    mask = batch.completion_mask
    assert (full - part)[mask].abs().max() < TOLERANCE
    assert (full_k - part_k)[mask].abs().max() < TOLERANCE
    for a, b in zip(full_g, part_g, strict=True):
        # fp32 reassociation: measured relative norms of the difference up to ~2e-6
        assert float((a - b).norm()) <= 1e-5 * float(a.norm())
    assert any(float(g.abs().max()) > 1e-3 for g in full_g)  # a real gradient was compared
    # The rows ran 22 tokens fewer each: L per row without the prefix, L - 22 with it.
    used = fed[1] // len(batch)
    assert fed[1:] == [len(batch) * used, len(batch) * (used - 22)]


def test_no_prefix_when_ungated_or_nothing_is_shared(tokenizer, llama_rollout):
    rollout = _prefixed_rollout(tokenizer, "llama")
    batch = rollout.batch
    ungated = _gated(rollout, gate=False).policy
    assert ungated.shared_prefix(batch.input_ids, batch.prompt_lens) is None
    other = llama_rollout.batch  # random prompts without a common first token
    assert _gated(llama_rollout).policy.shared_prefix(other.input_ids, other.prompt_lens) is None


# Decoder tokens saved per step, by distill.micro_batch_size. The prompts are the 22 shared tokens
# plus 3, 9 and 5 of their own, 2 samples each: a group shares 24, 30 and 26 tokens (its prompt
# less one). One row or one group per micro-batch: every row skips its group's prefix (2 x (24 +
# 30 + 26) = 160), paid once per group (22 + 2 + 8 + 4 = 36), the second row of a group reusing
# the first's when they are micro-batches of their own: 124. Four rows (A A B B, C C): the first
# micro-batch shares only the 22, the second its group's 26: 6 x 22 + 2 x 4 - (22 + 4) = 114.
SAVED = {1: 124, 2: 124, 4: 114}


@pytest.mark.parametrize("micro_batch_size", sorted(SAVED))
def test_step_with_and_without_the_shared_prefix(tokenizer, micro_batch_size):
    rollout = _prefixed_rollout(tokenizer, "llama")
    batch = rollout.batch
    dense = dense_logprobs(rollout.model, batch)
    topk = dense_topk(rollout.model, batch, 5)
    zeros = torch.zeros(batch.input_ids.shape)
    runs = []
    for share in (False, True):
        distill = _gated(rollout)
        distill.cfg = replace(
            distill.cfg, share_prefix=share, pg_coef=0.0, lambda_kl=1.0,
            micro_batch_size=micro_batch_size,
        )  # fmt: skip
        fed = _decoder_tokens(distill)
        runs.append((distill.step(batch, dense, zeros, 1.0, dense_topk=topk), sum(fed)))
    (full, full_tokens), (shared, shared_tokens) = runs
    # The gradient norm covers every adapter tensor; Adam's first update is ~lr * sign(g), which
    # float noise flips where g is ~0, so the updated weights are not compared element-wise.
    for key in ("distill/loss", "distill/kl_topk", "distill/grad_norm"):
        assert full[key] == pytest.approx(shared[key], rel=1e-4)
    assert shared_tokens == full_tokens - SAVED[micro_batch_size]
