"""The gated sparse policy runs the prompt prefix its rows share once (SparsePolicy.shared_prefix):
the same log-probs, top-K log-probs and adapter gradient as the full forward per row, over fewer
decoder tokens, and the same DistillSparse step."""

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


def test_step_with_and_without_the_shared_prefix(tokenizer):
    rollout = _prefixed_rollout(tokenizer, "llama")
    batch = rollout.batch
    dense = dense_logprobs(rollout.model, batch)
    topk = dense_topk(rollout.model, batch, 5)
    zeros = torch.zeros(batch.input_ids.shape)
    runs = []
    for share in (False, True):
        distill = _gated(rollout)
        distill.cfg = replace(distill.cfg, share_prefix=share, pg_coef=0.0, lambda_kl=1.0)
        fed = _decoder_tokens(distill)
        runs.append((distill.step(batch, dense, zeros, 1.0, dense_topk=topk), sum(fed)))
    (full, full_tokens), (shared, shared_tokens) = runs
    # The gradient norm covers every adapter tensor; Adam's first update is ~lr * sign(g), which
    # float noise flips where g is ~0, so the updated weights are not compared element-wise.
    for key in ("distill/loss", "distill/kl_topk", "distill/grad_norm"):
        assert full[key] == pytest.approx(shared[key], rel=1e-4)
    assert shared_tokens == full_tokens - (len(batch) - 1) * 22
