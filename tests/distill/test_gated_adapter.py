"""DistillSparse's gated adapter: phi acts only at sparse tokens, in training and in the engine.

A token is sparse when its decode step reads fewer pages than its context holds (budget < pages).
The rollouts of sparse_rollouts.py (pages of 4 tokens, budget 4 pages) hold both kinds: the first
completion tokens of the 9- and 13-token prompts fit in 4 pages (dense), the later ones do not.
"""

from dataclasses import replace

import pytest
import torch
from sparse_rollouts import dense_logprobs, make_rollout

from sparrow.distill import DistillConfig, DistillSparse
from sparrow.rl.batch import collate_rollouts
from sparrow.rollout.engine import SamplingParams

# fp32 on CPU: the engine's gated decode and the gated masked forward differ by float
# reassociation only: measured max 8.8e-6 in log-prob over Llama/Qwen3, quest/centroid scores and
# four LoRA target sets (as for the ungated forward, test_distill_sparse.py).
TOLERANCE = 2e-5


def _gated(rollout, target_modules="all-linear", gate=True, seed=0) -> DistillSparse:
    """A DistillSparse whose adapter has random nonzero B (peft starts B at 0)."""
    cfg = DistillConfig(enabled=True, rank=4, alpha=8.0, target_modules=target_modules, gate=gate)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        distill = DistillSparse(cfg, rollout.model, rollout.engine.runner.kv.cfg, actor_lr=1e-3)
        with torch.no_grad():
            for name, p in distill.policy.peft_model.named_parameters():
                if "lora_B" in name:
                    p.normal_(std=0.1)
    return distill


def _sparse_tokens(batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) bool masks of the completion tokens decoded sparsely and densely."""
    pages = (torch.arange(batch.input_ids.shape[1]) + 3) // 4  # context of the token at t, pages
    sparse = (batch.budget_pages < pages) & batch.completion_mask
    return sparse, batch.completion_mask & ~sparse


def _resample(rollout):
    """New rollouts of the batch's prompts from the engine as it is now."""
    batch = rollout.batch
    prompts = [batch.input_ids[b, : batch.prompt_lens[b]].tolist() for b in range(0, len(batch), 2)]
    params = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True)
    outputs = rollout.engine.generate(prompts, params, n=2)
    return collate_rollouts(prompts, outputs, 0)


def _score_logprobs(engine, batch) -> torch.Tensor:
    """(B, T) log-probs of the batch's completions under engine.score (one call, all rows)."""
    prompts, completions = [], []
    for b in range(len(batch)):
        p0, end = int(batch.prompt_lens[b]), int(batch.attention_mask[b].sum())
        prompts.append(batch.input_ids[b, :p0].tolist())
        completions.append(batch.input_ids[b, p0:end])
    out = torch.zeros(batch.input_ids.shape)
    for b, logits in enumerate(engine.score(prompts, [c.tolist() for c in completions])):
        picked = torch.log_softmax(logits, -1).gather(-1, completions[b][:, None])[:, 0]
        out[b, int(batch.prompt_lens[b]) : int(batch.prompt_lens[b]) + len(picked)] = picked
    return out


def _policy_logprobs(distill, batch) -> torch.Tensor:
    with torch.no_grad():
        logprobs, _ = distill.policy.token_logprobs(
            batch.input_ids, batch.completion_mask, batch.budget_pages, temperature=1.0
        )
    return logprobs


@pytest.mark.parametrize(
    "family,targets",
    [
        ("llama", "all-linear"),
        ("qwen3", "all-linear"),
        ("qwen2", "all-linear"),  # q/k/v biases stay in the base weights, not the adapter
        ("mistral", "all-linear"),
        ("qwen3", ["q_proj", "v_proj", "down_proj"]),  # rank-0 blocks in the fused q/k/v, gate/up
    ],
)
def test_gated_training_forward_matches_engine_gated_decode(tokenizer, family, targets):
    rollout = make_rollout(tokenizer, family)
    distill = _gated(rollout, targets)
    rollout.engine.set_lora(distill.lora_factors())
    batch = _resample(rollout)
    sparse, dense = _sparse_tokens(batch)
    assert sparse.sum() > 50 and dense.sum() > 5
    policy = _policy_logprobs(distill, batch)
    mask = batch.completion_mask
    assert (policy - batch.sampled_logprobs)[mask].abs().max() < TOLERANCE  # as sampled
    assert (policy - _score_logprobs(rollout.engine, batch))[mask].abs().max() < TOLERANCE
    # The adapter is far from zero: without it the sparse policy gives other log-probs.
    rollout.engine.set_lora(None)
    assert (_score_logprobs(rollout.engine, batch) - policy)[sparse].abs().max() > 0.05


def test_adapter_acts_at_sparse_tokens_only(tokenizer):
    rollout = make_rollout(tokenizer, "llama", seed=2)
    batch, engine = rollout.batch, rollout.engine  # sampled without an adapter
    sparse, dense = _sparse_tokens(batch)
    assert sparse.sum() > 50 and dense.sum() > 5
    base_engine = _score_logprobs(engine, batch)
    gated = _gated(rollout)
    base = _policy_logprobs(_zero_b(rollout), batch)
    # Training-time forward: the base sparse policy at dense tokens, moved at sparse ones.
    policy = _policy_logprobs(gated, batch)
    assert (policy - base)[dense].abs().max() < 1e-6
    assert (policy - base)[sparse].abs().mean() > 0.02
    # The same phi merged (gate off) moves the dense tokens too: the check above can fail.
    merged = _policy_logprobs(_gated(rollout, gate=False), batch)
    assert (merged - base)[dense].abs().max() > 0.02
    # Engine: identical at dense tokens (prompt prefill, dense decode), moved at sparse ones.
    engine.set_lora(gated.lora_factors())
    with_lora = _score_logprobs(engine, batch)
    engine.set_lora(None)
    assert torch.equal(with_lora[dense], base_engine[dense])
    assert (with_lora - base_engine)[sparse].abs().mean() > 0.02
    assert (with_lora - policy)[batch.completion_mask].abs().max() < TOLERANCE


def _zero_b(rollout) -> DistillSparse:
    """The base sparse policy: an adapter with B = 0, as peft initialises it."""
    cfg = DistillConfig(enabled=True, rank=4, alpha=8.0)
    return DistillSparse(cfg, rollout.model, rollout.engine.runner.kv.cfg, actor_lr=1e-3)


def test_engine_lora_none_zero_and_kept_by_update_weights(tokenizer):
    rollout = make_rollout(tokenizer, "qwen3", seed=3)
    engine, batch = rollout.engine, rollout.batch
    base = _score_logprobs(engine, batch)
    factors = _gated(rollout).lora_factors()
    zero_b = {name: (a, torch.zeros_like(b)) for name, (a, b) in factors.items()}
    engine.set_lora(zero_b)
    assert torch.equal(_score_logprobs(engine, batch), base)
    engine.set_lora(factors)
    with_lora = _score_logprobs(engine, batch)
    assert (with_lora - base)[batch.completion_mask].abs().max() > 0.05
    engine.update_weights(rollout.model.state_dict())  # a theta sync keeps the factors
    assert torch.equal(_score_logprobs(engine, batch), with_lora)
    engine.set_lora(None)
    assert torch.equal(_score_logprobs(engine, batch), base)
    # peft's prefixed names are accepted; unknown modules and wrong shapes are refused.
    name = "model.layers.1.mlp.down_proj"
    engine.set_lora({"base_model.model." + name: factors[name]})
    engine.set_lora(None)
    with pytest.raises(KeyError, match="no LoRA target"):
        engine.set_lora({"lm_head": factors[name]})
    with pytest.raises(ValueError, match="do not fit"):
        engine.set_lora({name: factors[name][::-1]})


def test_gated_step_trains_only_the_adapter_and_only_on_sparse_tokens(tokenizer):
    rollout = make_rollout(tokenizer, "llama", seed=4)
    batch = rollout.batch
    dense, advantages = dense_logprobs(rollout.model, batch), batch.completion_mask.float()
    distill = _gated(rollout)
    base_before = {k: v.clone() for k, v in distill.policy._base.items()}
    adapter_before = distill.policy.adapter_state_dict()
    metrics = distill.step(batch, dense, advantages, temperature=1.0)
    assert metrics["distill/grad_norm"] > 0
    assert all(torch.equal(v, base_before[k]) for k, v in distill.policy._base.items())
    assert all(p.grad is None for p in rollout.model.parameters())
    after = distill.policy.adapter_state_dict()
    assert all(not torch.equal(after[k], adapter_before[k]) for k in after)  # A and B moved
    # The same rollouts with every token dense: the gate is shut, phi gets no gradient (a fresh
    # adapter, so that no Adam momentum moves it either).
    all_dense = replace(batch, budget_pages=torch.full_like(batch.budget_pages, 1000))
    fresh = _gated(rollout)
    before = fresh.policy.adapter_state_dict()
    assert fresh.step(all_dense, dense, advantages, temperature=1.0)["distill/grad_norm"] == 0.0
    assert all(torch.equal(v, before[k]) for k, v in fresh.policy.adapter_state_dict().items())
