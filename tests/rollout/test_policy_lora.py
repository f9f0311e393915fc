"""The policy's LoRA adapter in the engine (LoRA RL, `LLMEngine.set_policy_lora`): added, unmerged,
at every forward (prefill, dense and sparse decode, score), so an engine holding base + adapter
computes what an engine holding the merged weights W + s B A does; DistillSparse's gated adapter
adds on top at sparse decode steps; updates land in place (captured graphs stay valid); over the
wire the adapter arrives as `<module>.lora_A/B` tensors.

Tolerance: the engine's (1e-4 in log-prob or logit, as against HF in test_engine.py): unmerged
and merged differ by float reassociation only (measured here: max 3.6e-5 in logit on the lively
Llama, whose logits are large; 9.5e-7 in log-prob against the peft model itself).
"""

import copy

import pytest
import torch
from tiny_lm import random_prompts

from sparrow.rl import policy_adapter
from sparrow.rl.actor_config import PolicyLoraConfig
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams
from sparrow.rollout.lora import wire_tensors

TOL = 1e-4
TEMPERATURE = 0.8


def _sparse(context_tokens: int) -> int:
    return 3  # pages of 4 tokens: decodes read 3 of them once the context passes 12 tokens


def _adapter(model, rank: int = 4, std: float = 0.3, seed: int = 0, targets="all-linear"):
    """(peft-wrapped copy of `model` with random nonzero B, its factors for the engine)."""
    cfg = PolicyLoraConfig(rank=rank, alpha=2.0 * rank, target_modules=targets)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        peft = policy_adapter.wrap(copy.deepcopy(model), cfg)
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if "lora_B" in name:
                    p.normal_(std=std)
    return peft, policy_adapter.factors(peft.base_model.model)


def _merged_engine(lm, factors, **overrides) -> LLMEngine:
    """An engine whose weights are base + s B A merged: what the unmerged adapter must equal."""
    engine = _engine(lm, **overrides)
    engine.update_weights(policy_adapter.merged_state_dict(lm.model.state_dict(), factors))
    return engine


def _engine(lm, **overrides) -> LLMEngine:
    cfg = EngineConfig(**{"page_size": 4, "num_pages": 128, **overrides})
    return LLMEngine(lm.model, lm.tokenizer, cfg)


def _params() -> SamplingParams:
    return SamplingParams(
        temperature=TEMPERATURE, top_k=50, max_tokens=14, ignore_eos=True, return_logits=True
    )


def _generate_and_replay(unmerged, merged, prompts, schedules):
    """The unmerged engine's rows (dense and sparse), and the merged engine's replay of them."""
    outs = unmerged.generate(prompts, _params(), n=2, schedules=schedules)
    replay = merged.score([o.prompt_ids for o in outs], [o.token_ids for o in outs], schedules)
    return outs, replay


def test_the_adapter_acts_at_prefill_dense_and_sparse_decode_and_score(lively_llama):
    lm = lively_llama
    _, factors = _adapter(lm.model)
    unmerged = _engine(lm)
    unmerged.set_policy_lora(factors)
    merged = _merged_engine(lm, factors)
    prompts = random_prompts(lm.model.config.vocab_size, [19, 6, 13], seed=3)
    schedules = [_sparse, None, None, _sparse, _sparse, None]  # n = 2 per prompt
    outs, replay = _generate_and_replay(unmerged, merged, prompts, schedules)
    diffs = [float((o.logits - r).abs().max()) for o, r in zip(outs, replay, strict=True)]
    assert max(diffs) <= TOL  # every row, the first token (prefill) and each decode step
    again = unmerged.score([o.prompt_ids for o in outs], [o.token_ids for o in outs], schedules)
    assert max(float((a - r).abs().max()) for a, r in zip(again, replay, strict=True)) <= TOL
    # Not vacuous: without the adapter the same engine is another policy.
    unmerged.set_policy_lora(None)
    base = unmerged.score([o.prompt_ids for o in outs], [o.token_ids for o in outs], schedules)
    assert min(float((b - r).abs().max()) for b, r in zip(base, replay, strict=True)) > 1e-2


def test_the_engine_equals_the_peft_model_it_came_from(tiny_qwen3):
    lm = tiny_qwen3
    peft, factors = _adapter(lm.model, targets="q_proj,v_proj,down_proj")
    engine = _engine(lm)
    engine.set_policy_lora(factors)
    prompts = random_prompts(lm.model.config.vocab_size, [11, 7], seed=4)
    completions = random_prompts(lm.model.config.vocab_size, [9, 12], seed=5)
    scored = engine.score(prompts, completions)
    for p, c, logits in zip(prompts, completions, scored, strict=True):
        with torch.no_grad():
            hf = peft(torch.tensor([p + c])).logits[0, len(p) - 1 : -1].float()  # (T, V)
            base = lm.model(torch.tensor([p + c])).logits[0, len(p) - 1 : -1]
        ours, theirs = logits.log_softmax(-1), hf.log_softmax(-1)
        assert float((ours - theirs).abs().max()) <= TOL
        assert float((hf - base).abs().max()) > 1e-2  # the adapter is not a no-op


def test_with_distill_sparse_the_two_deltas_add_at_sparse_steps(lively_llama):
    lm = lively_llama
    _, policy = _adapter(lm.model, seed=0)
    _, phi = _adapter(lm.model, rank=2, seed=1)
    both = _engine(lm)
    both.set_policy_lora(policy)
    both.set_lora(phi)  # DistillSparse's: gated to sparse decode steps
    merged = _merged_engine(lm, policy)
    merged.set_lora(phi)
    prompts = random_prompts(lm.model.config.vocab_size, [19, 13], seed=6)
    schedules = [_sparse, _sparse, None, _sparse]
    outs, replay = _generate_and_replay(both, merged, prompts, schedules)
    assert max(float((o.logits - r).abs().max()) for o, r in zip(outs, replay, strict=True)) <= TOL
    # phi acted: the sparse rows differ from the adapted policy without it.
    merged.set_lora(None)
    plain = merged.score([o.prompt_ids for o in outs], [o.token_ids for o in outs], schedules)
    assert float((outs[0].logits - plain[0]).abs().max()) > 1e-2
    assert float((outs[2].logits - plain[2]).abs().max()) <= TOL  # a dense row: phi is off


def test_a_new_adapter_of_the_same_shape_is_copied_in_place(tiny_qwen3):
    lm = tiny_qwen3
    engine = _engine(lm)
    _, first = _adapter(lm.model, seed=0)
    _, second = _adapter(lm.model, seed=1)
    _, wider = _adapter(lm.model, rank=8, seed=2)
    model = engine.runner.model
    assert (
        engine.set_policy_lora(first) == sum(a.numel() + b.numel() for a, b in first.values()) * 4
    )
    pointers = [d.a.data_ptr() for layer in model.policy_lora for d in vars(layer).values()]
    assert not model.set_policy_lora(second)  # same shapes: the same tensors, new values
    assert [d.a.data_ptr() for layer in model.policy_lora for d in vars(layer).values()] == pointers
    name = "model.layers.1.self_attn.q_proj"
    rows = lm.model.config.num_attention_heads * lm.model.config.head_dim
    torch.testing.assert_close(model.policy_lora[1].qkv.b[:rows, :4], second[name][1])
    assert model.set_policy_lora(wider)  # another rank: new tensors (graphs are redone)
    assert model.set_policy_lora(None) and model.policy_lora is None


def test_the_adapter_arrives_over_the_wire_as_it_was_set(tiny_qwen3):
    lm = tiny_qwen3
    _, factors = _adapter(lm.model)
    direct, pushed = _engine(lm), _engine(lm)
    direct.set_policy_lora(factors)
    pairs = list(wire_tensors(factors))
    pushed.update_policy_lora_in_buckets([dict(pairs[:5]), dict(pairs[5:])])
    for a, b in zip(direct.runner.model.policy_lora, pushed.runner.model.policy_lora, strict=True):
        for name in vars(a):
            assert torch.equal(getattr(a, name).a, getattr(b, name).a)
            assert torch.equal(getattr(a, name).b, getattr(b, name).b)
    with pytest.raises(KeyError, match="lacks A or B"):
        pushed.update_policy_lora_in_buckets([dict(pairs[:3])])
    with pytest.raises(KeyError, match="no adapter factor"):
        pushed.update_policy_lora_in_buckets([{"model.norm.weight": torch.ones(4)}])
