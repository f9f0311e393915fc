"""DistillSparse against the rollout engine: same sparse policy, adapter-only training, state."""

import io

import pytest
import torch
from sparse_rollouts import dense_logprobs, dense_topk, make_rollout

from sparrow.distill import DistillConfig, DistillSparse
from sparrow.distill.loss import distill_loss, kl_topk

# fp32 on CPU: the engine's paged decode and the parallel training forward differ only by float
# reassociation (measured max ~8e-6 over 4 model/score combinations).
TOLERANCE = 5e-5


def _engine_logprobs(engine, batch):
    """(B, T) log-probs of the batch's completions under the engine's sparse replay."""
    out = torch.zeros(batch.input_ids.shape)
    for b in range(len(batch)):
        p0, end = int(batch.prompt_lens[b]), int(batch.attention_mask[b].sum())
        prompt, completion = batch.input_ids[b, :p0], batch.input_ids[b, p0:end]
        logits = engine.score([prompt.tolist()], [completion.tolist()])[0]  # (n, V)
        out[b, p0:end] = torch.log_softmax(logits, -1).gather(-1, completion[:, None])[:, 0]
    return out


def _distill(rollout, **overrides) -> DistillSparse:
    cfg = DistillConfig(enabled=True, rank=4, alpha=8.0, **overrides)
    return DistillSparse(cfg, rollout.model, rollout.engine.runner.kv.cfg, actor_lr=1e-3)


def _advantages(batch):
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])[: len(batch)]  # (B,)
    return adv[:, None] * batch.completion_mask


@pytest.mark.parametrize(
    "family,score",
    [
        ("llama", "quest"),
        ("qwen3", "quest"),
        ("qwen2", "quest"),
        ("mistral", "quest"),
        ("llama", "centroid"),
    ],
)
def test_training_forward_matches_engine_sparse_decode(tokenizer, family, score):
    rollout = make_rollout(tokenizer, family, score)
    batch, mask = rollout.batch, rollout.batch.completion_mask
    positions = torch.arange(batch.input_ids.shape[1])
    dense_pages = (positions + 3) // 4  # ceil(t / PAGE): the context of the token at t, in pages
    assert (batch.budget_pages < dense_pages)[mask].float().mean() > 0.5
    with torch.no_grad():
        sparse, _ = _distill(rollout).policy.token_logprobs(
            batch.input_ids, mask, batch.budget_pages, temperature=1.0
        )
    replay = _engine_logprobs(rollout.engine, batch)
    assert (sparse - batch.sampled_logprobs)[mask].abs().max() < TOLERANCE  # as sampled
    assert (sparse - replay)[mask].abs().max() < TOLERANCE  # engine.score replay
    # Selection really dropped pages: the dense policy is far from the sparse one.
    assert (dense_logprobs(rollout.model, batch) - sparse)[mask].abs().max() > 0.1


def test_zero_adapter_is_the_base_sparse_policy(llama_rollout):
    distill = _distill(llama_rollout)
    base = llama_rollout.model.state_dict()
    merged = distill.merged_state_dict()
    assert set(merged) == set(base)
    assert all(torch.equal(merged[k], base[k]) for k in base)
    lora_a = [p for n, p in distill.policy.peft_model.named_parameters() if "lora_A" in n]
    assert all(p.abs().sum() > 0 for p in lora_a)  # the adapter is there, only B is zero
    engine, batch = llama_rollout.engine, llama_rollout.batch
    before = _engine_logprobs(engine, batch)
    engine.update_weights(merged)
    assert torch.equal(_engine_logprobs(engine, batch), before)


def test_step_trains_only_the_adapter_and_merges_into_the_engine(tokenizer):
    rollout = make_rollout(tokenizer, "qwen3", seed=1)
    batch = rollout.batch
    original = {k: v.clone() for k, v in rollout.model.state_dict().items()}
    distill = _distill(rollout, gate=False)  # merged phi (the gated mode: test_gated_adapter.py)
    base_before = {k: v.clone() for k, v in distill.policy._base.items()}
    adapter_before = distill.policy.adapter_state_dict()
    metrics = distill.step(
        batch, dense_logprobs(rollout.model, batch), _advantages(batch), temperature=1.0
    )
    assert metrics["distill/grad_norm"] > 0
    # The dense model and the sparse policy's frozen copy are untouched and got no gradient.
    assert all(torch.equal(v, original[k]) for k, v in rollout.model.state_dict().items())
    assert all(p.grad is None for p in rollout.model.parameters())
    assert all(torch.equal(v, base_before[k]) for k, v in distill.policy._base.items())
    assert rollout.model.config._attn_implementation != "sparrow_block_sparse"
    after = distill.policy.adapter_state_dict()
    changed = [k for k in after if not torch.equal(after[k], adapter_before[k])]
    # With B = 0 only B gets a gradient on the first step (dL/dA is proportional to B).
    assert set(changed) == {k for k in after if "lora_B" in k} and changed
    # theta + phi in the engine reproduces the adapter's sparse forward.
    with torch.no_grad():
        sparse, _ = distill.policy.token_logprobs(
            batch.input_ids, batch.completion_mask, batch.budget_pages, 1.0
        )
    rollout.engine.update_weights(distill.merged_state_dict())
    replay = _engine_logprobs(rollout.engine, batch)
    mask = batch.completion_mask
    assert (sparse - replay)[mask].abs().max() < TOLERANCE
    assert (sparse - batch.sampled_logprobs)[mask].abs().max() > 1e-3  # the policy moved


def test_distillation_closes_the_gap_to_dense(llama_rollout):
    batch, model = llama_rollout.batch, llama_rollout.model
    distill = _distill(llama_rollout, pg_coef=0.0, lambda_k3=1.0)
    distill.optimizer.param_groups[0]["lr"] = 3e-3
    dense, zeros = dense_logprobs(model, batch), torch.zeros(batch.input_ids.shape)
    k3 = [distill.step(batch, dense, zeros, temperature=1.0)["distill/k3"] for _ in range(6)]
    assert k3[-1] < 0.7 * k3[0]


def test_micro_batch_split_does_not_change_loss_or_gradient(llama_rollout):
    batch, model = llama_rollout.batch, llama_rollout.model
    dense, adv = dense_logprobs(model, batch), _advantages(batch)
    runs = []
    for micro_batch_size in (1, 6):
        torch.manual_seed(0)  # the same LoRA A initialisation
        distill = _distill(llama_rollout, micro_batch_size=micro_batch_size)
        runs.append(distill.step(batch, dense, adv, temperature=1.0))
    for key in ("distill/loss", "distill/k3", "distill/grad_norm"):
        assert runs[0][key] == pytest.approx(runs[1][key], rel=1e-4)


def test_checkpoint_round_trip(llama_rollout):
    batch, model = llama_rollout.batch, llama_rollout.model
    dense, adv = dense_logprobs(model, batch), _advantages(batch)
    first = _distill(llama_rollout)
    first.step(batch, dense, adv, temperature=1.0)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    second = _distill(llama_rollout)
    second.load_state_dict(torch.load(buffer, weights_only=True))
    assert second.num_steps == 1
    m1 = first.step(batch, dense, adv, temperature=1.0)
    m2 = second.step(batch, dense, adv, temperature=1.0)
    assert m1 == m2
    a1, a2 = first.policy.adapter_state_dict(), second.policy.adapter_state_dict()
    assert all(torch.equal(a1[k], a2[k]) for k in a1)


def test_load_base_takes_new_dense_weights(llama_rollout):
    distill = _distill(llama_rollout)
    name = "model.layers.1.self_attn.q_proj.weight"
    new = llama_rollout.model.state_dict()[name] + 1.0
    distill.load_base({"module." + name: new})
    assert torch.equal(distill.merged_state_dict()[name], new)  # B = 0: merged is the base
    assert not torch.equal(llama_rollout.model.state_dict()[name], new)
    with pytest.raises(KeyError, match="unexpected weight"):
        distill.load_base({"model.layers.1.self_attn.q_proj.lora_A.weight": new})


def test_loss_by_hand():
    sparse = torch.tensor([[0.0, -1.0, -2.0]], requires_grad=True)  # (1, 3)
    dense = torch.tensor([[0.0, -0.5, -2.5]])
    adv = torch.tensor([[0.0, 2.0, 2.0]])
    mask = torch.tensor([[False, True, True]])
    loss, metrics = distill_loss(sparse, dense, adv, mask, 4.0, pg_coef=0.5, lambda_k3=0.1)
    d = torch.tensor([0.5, -0.5])  # logp_dense - logp_sparse on the two tokens
    k3 = (d.exp() - d - 1).sum() / 4
    pg = -(2.0 + 2.0) / 4
    assert float(metrics["k3"]) == pytest.approx(float(k3))
    assert float(metrics["pg_loss"]) == pytest.approx(pg)
    assert float(loss) == pytest.approx(0.5 * pg + 0.1 * float(k3))
    loss.backward()
    # d/dlogp: pg_coef * (-A) / N + lambda * (1 - exp(d)) / N; masked tokens get nothing.
    expected = torch.cat([torch.zeros(1), (0.5 * -2.0 + 0.1 * (1 - d.exp())) / 4])
    assert torch.allclose(sparse.grad[0], expected)


def test_kl_topk_is_the_bucketed_kl():
    torch.manual_seed(0)
    p, q = torch.randn(3, 50).log_softmax(-1), torch.randn(3, 50).log_softmax(-1)  # (3, V)
    full = (p.exp() * (p - q)).sum(-1)  # (3,)
    assert torch.allclose(kl_topk(p, q), full, atol=1e-5)  # K = V: the exact KL
    ids = p.topk(5, dim=-1).indices  # (3, 5)
    coarse = kl_topk(p.gather(-1, ids), q.gather(-1, ids))
    p_rest = 1 - p.gather(-1, ids).exp().sum(-1)
    q_rest = 1 - q.gather(-1, ids).exp().sum(-1)
    head = (p.gather(-1, ids).exp() * (p.gather(-1, ids) - q.gather(-1, ids))).sum(-1)
    assert torch.allclose(coarse, head + p_rest * (p_rest.log() - q_rest.log()), atol=1e-6)
    assert (coarse <= full + 1e-6).all() and (coarse > 0).all()  # a lower bound, not zero
    assert float(kl_topk(p.gather(-1, ids), p.gather(-1, ids)).abs().max()) < 1e-6


def test_topk_kl_term_trains_towards_dense(llama_rollout):
    batch, model = llama_rollout.batch, llama_rollout.model
    distill = _distill(llama_rollout, pg_coef=0.0, lambda_k3=0.0, lambda_kl=1.0)
    distill.optimizer.param_groups[0]["lr"] = 3e-3
    dense, zeros = dense_logprobs(model, batch), torch.zeros(batch.input_ids.shape)
    topk = dense_topk(model, batch, k=8)
    with pytest.raises(ValueError, match="top-K"):
        distill.step(batch, dense, zeros, temperature=1.0)
    kl = [
        distill.step(batch, dense, zeros, temperature=1.0, dense_topk=topk)["distill/kl_topk"]
        for _ in range(6)
    ]
    assert kl[0] > 0.01 and kl[-1] < 0.7 * kl[0]
    # The sparse log-probs of the top-K ids line up with the dense ones' positions.
    _, sparse_topk = distill.policy.token_logprobs(
        batch.input_ids, batch.completion_mask, batch.budget_pages, 1.0, topk_ids=topk[0]
    )
    mask = batch.completion_mask
    assert sparse_topk.shape == topk[1].shape and (sparse_topk[~mask] == 0).all()
    assert (sparse_topk - topk[1])[mask].abs().mean() < 0.5
