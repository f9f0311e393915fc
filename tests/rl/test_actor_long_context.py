"""The actor at long context: micro-batches cut by a token budget (splitting a GRPO group that
does not fit) and activation checkpointing change neither the log-probs nor the update."""

import pytest
import torch
from test_actor_shared_prompt import GROUPS, group_batch, logprobs, make_actor
from tiny_lm import pg_loss_fn


def _update(actor, batch):
    """(train_step metrics, weights after the step, the micro-batch row counts)."""
    loss_fn = pg_loss_fn(int(batch["completion_mask"].sum()))
    micro_batches = actor.micro_batches(batch)
    metrics = actor.train_step(micro_batches, loss_fn)
    params = {k: v.clone() for k, v in actor.gathered_state_dict().items()}
    return metrics, params, [len(mb["input_ids"]) for mb in micro_batches]


def _assert_same_update(a, b, weights_rel: float = 1e-6):
    (m_a, p_a, _), (m_b, p_b, _) = a, b
    assert m_b["skipped"] == 0 and m_b["grad_norm"] > 0
    assert m_b["loss"] == pytest.approx(m_a["loss"], rel=1e-5)
    assert m_b["grad_norm"] == pytest.approx(m_a["grad_norm"], rel=1e-5)
    for name, param in p_a.items():
        rel = (p_b[name] - param).abs().max() / param.abs().max().clamp_min(1e-12)
        assert rel <= weights_rel, name


@pytest.mark.parametrize("share", [True, False])
def test_token_budget_split_gives_the_unsplit_update(share):
    """Group 0 (prompt 9, completions up to 6) cannot fit a 25-token budget whole: it is split,
    and every micro-batch of the step lands within the budget; loss, gradient norm and the
    updated weights equal one micro-batch holding the whole step."""
    batch = group_batch(GROUPS, seed=2)
    whole = make_actor("qwen3", share, micro_batch_size=64, lr=1e-5)
    split = make_actor("qwen3", share, max_tokens_per_micro_batch=25, lr=1e-5)
    torch.testing.assert_close(
        logprobs(split, batch).token_logprobs, logprobs(whole, batch).token_logprobs, atol=1e-5,
        rtol=0,
    )  # fmt: skip
    unsplit, budgeted = _update(whole, batch), _update(split, batch)
    assert unsplit[2] == [7] and len(budgeted[2]) >= 3
    # With share_prefix the whole batch (two groups sharing no token) and the split one (one
    # group per micro-batch: a prefix of all but its last prompt token) add the same attention
    # terms in different orders: ~1e-7 round-off of the gradient, which AdamW's first step
    # (lr * g / |g|) lifts to ~1.7e-6 of the weights on elements with tiny gradients; a wrong
    # gradient moves them by ~lr / |w| ~ 5e-4.
    _assert_same_update(unsplit, budgeted, weights_rel=5e-6 if share else 1e-6)


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_activation_checkpointing_gives_the_same_update(family, share):
    batch = group_batch(GROUPS, seed=4)
    plain = make_actor(family, share, lr=1e-5)
    recomputed = make_actor(family, share, lr=1e-5, activation_checkpointing=True)
    _assert_same_update(_update(plain, batch), _update(recomputed, batch))


def test_activation_checkpointing_recomputes_the_layers():
    """The decoder layers run again in backward (that is where the memory goes), and only when
    gradients are on."""
    batch = group_batch(GROUPS, seed=4)
    actor = make_actor("qwen3", True, activation_checkpointing=True, micro_batch_size=64)
    layer = actor.model.get_decoder().layers[0].mlp
    calls = []
    # A pre-hook: the replay stops as soon as it has every saved tensor, before the MLP returns.
    layer.register_forward_pre_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    logprobs(actor, batch)
    assert len(calls) == 3  # prefix, prompt and completion passes, no replay
    calls.clear()
    _update(actor, batch)
    assert len(calls) == 6  # the three passes, each replayed once in backward
