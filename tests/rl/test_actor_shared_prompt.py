"""The dense actor with each GRPO group's prompt computed once (share_prompts): same log-probs,
same gradient and less decoder work than scoring every row's full sequence."""

import pytest
import torch
from tiny_lm import VOCAB, grouped_batch, pg_loss_fn, tiny_causal_lm

from sparrow.rl.actor import DenseActor
from sparrow.rl.actor_config import ActorConfig
from sparrow.rl.micro_batches import micro_batch_slices, split_micro_batches

# Two groups with different prompts (lengths 9 and 5): unequal completion lengths (one of a
# single token), right padding, and a group of 4 beside a group of 3.
GROUPS = [(9, [4, 1, 6, 3]), (5, [7, 2, 7])]


def group_batch(groups, seed: int) -> dict[str, torch.Tensor]:
    """Right-padded rows, consecutive per group, each group's rows sharing one random prompt."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, VOCAB, (p,), generator=gen) for p, _ in groups]
    return grouped_batch(prompts, [lens for _, lens in groups], gen, first_id=7)


def make_actor(family: str, share: bool, **overrides) -> DenseActor:
    cfg = {"zero_stage": 2, "lr": 1e-3, "micro_batch_size": 4, "precision": "fp32"}
    cfg |= {"share_prompts": share, "logprob_chunk_tokens": 6} | overrides
    return DenseActor(tiny_causal_lm(family), ActorConfig(**cfg))


def logprobs(actor: DenseActor, batch: dict, temperature: float = 1.0):
    return actor.compute_logprobs(
        batch["input_ids"],
        batch["attention_mask"],
        topk=4,
        temperature=temperature,
        prompt_lens=batch["prompt_lens"],
        group_ids=batch["group_ids"],
    )


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2", "mistral"])
@pytest.mark.parametrize("micro_batch_size", [4, 7])  # one group / both groups per micro-batch
def test_shared_logprobs_equal_per_row(family, micro_batch_size):
    batch = group_batch(GROUPS, seed=1)
    per_row = logprobs(make_actor(family, False, micro_batch_size=micro_batch_size), batch, 0.7)
    shared = logprobs(make_actor(family, True, micro_batch_size=micro_batch_size), batch, 0.7)
    for name in ("token_logprobs", "topk_logprobs", "entropy"):
        diff = (getattr(shared, name) - getattr(per_row, name)).abs().max()
        assert diff <= 1e-5, (name, float(diff))
    assert torch.equal(shared.topk_ids, per_row.topk_ids)
    assert shared.token_logprobs.shape == batch["input_ids"].shape
    # Completion and prompt positions are scored (non-zero), position 0 and padding are 0.
    scored = batch["attention_mask"].clone()
    scored[:, 0] = False
    assert (shared.token_logprobs[scored] < 0).all()
    assert shared.token_logprobs[~scored].abs().max() == 0
    assert shared.topk_ids[~scored].abs().max() == 0


@pytest.mark.parametrize(("family", "zero_stage"), [("qwen3", 0), ("llama", 0), ("qwen3", 3)])
def test_shared_train_step_gives_the_same_gradient_and_update(family, zero_stage):
    batch = group_batch(GROUPS, seed=2)
    loss_fn = pg_loss_fn(int(batch["completion_mask"].sum()))
    results = []
    for share in (False, True):
        # AdamW's first step is about lr * g / (|g| + eps): on an element with |g| ~ 1e-7 the
        # ~1e-9 round-off of g moves the update by ~1e-3 lr, so lr stays small enough that this
        # stays below 3e-6 of the weights (1.13e-6 measured on a 2-core AVX-512 Xeon VM, under
        # 1e-6 on other hosts) while a wrong gradient (a flipped sign: 2 lr) does not.
        actor = make_actor(family, share, zero_stage=zero_stage, lr=1e-5)
        old = logprobs(actor, batch).token_logprobs
        seen, grads = [], {}
        if zero_stage == 0:  # stage 0 keeps full gradients on the parameters until the step
            step = actor._optimizer_step

            def capture(actor=actor, step=step, grads=grads):
                for name, p in actor.model.named_parameters():
                    grads[name] = p.grad.clone()
                return step()

            actor._optimizer_step = capture

        def recording_loss(new_logprobs, mb, seen=seen):
            seen.append(new_logprobs.detach())
            return loss_fn(new_logprobs, mb)

        group_ids = batch["group_ids"] if share else None
        metrics = actor.train_step(split_micro_batches(batch, 4, group_ids), recording_loss)
        # The training pass scores like compute_logprobs: the PPO ratio starts at exactly 1.
        torch.testing.assert_close(torch.cat(seen), old, atol=1e-6, rtol=0)
        params = {k: v.clone() for k, v in actor.gathered_state_dict().items()}
        results.append((metrics, params, grads))
    (m_row, p_row, g_row), (m_shared, p_shared, g_shared) = results
    assert m_shared["skipped"] == 0 and m_shared["grad_norm"] > 0
    assert m_shared["grad_norm"] == pytest.approx(m_row["grad_norm"], rel=1e-5)
    assert m_shared["loss"] == pytest.approx(m_row["loss"], rel=1e-5)
    for name, grad in g_row.items():
        scale = grad.abs().max().clamp_min(1e-12)
        assert (g_shared[name] - grad).abs().max() / scale <= 1e-5, name
    initial = tiny_causal_lm(family).state_dict()
    assert max(float((p_row[k] - initial[k]).abs().max()) for k in p_row) > 5e-6  # it trained
    for name, param in p_row.items():
        rel = (p_shared[name] - param).abs().max() / param.abs().max().clamp_min(1e-12)
        assert rel <= 3e-6, name


def test_shared_prompt_runs_the_decoder_on_fewer_tokens():
    """One group of 4 x (10-token prompt + 5 tokens): 10 + 4 * 4 decoder tokens, not 4 * 15
    (the last completion token predicts nothing, so the shared pass leaves it out)."""
    batch = group_batch([(10, [5, 5, 5, 5])], seed=3)
    counts = {}
    for share in (False, True):
        model = tiny_causal_lm("llama")
        seen = []
        model.get_input_embeddings().register_forward_hook(
            lambda mod, inp, out, seen=seen: seen.append(inp[0].numel())
        )
        cfg = ActorConfig(zero_stage=2, micro_batch_size=4, precision="fp32", share_prompts=share)
        logprobs(DenseActor(model, cfg), batch)
        counts[share] = sum(seen)
    assert counts == {False: 4 * 15, True: 10 + 4 * 4}


@pytest.mark.parametrize(
    ("share_prefix", "calls"),
    [(False, [(1, 6), (3, 1)]), (True, [(1, 5), (1, 1), (3, 1)])],  # (prefix,) prompt, fed
)
def test_one_token_completions_still_make_every_decoder_pass(share_prefix, calls):
    """A micro-batch whose completions are all one token long feeds one masked token, so every
    rank makes the same module calls under ZeRO-3; the log-probs still equal the per-row ones.
    `share_prefix` reaches the policy: one more pass, over the group's prompt less one token."""
    batch = group_batch([(6, [1, 1, 1])], seed=5)
    seen = []
    model = tiny_causal_lm("qwen3")
    model.get_input_embeddings().register_forward_hook(
        lambda mod, inp, out: seen.append(tuple(inp[0].shape))
    )
    cfg = ActorConfig(zero_stage=2, micro_batch_size=4, precision="fp32", share_prefix=share_prefix)
    shared = logprobs(DenseActor(model, cfg), batch)
    assert seen == calls
    per_row = logprobs(make_actor("qwen3", False), batch)
    assert (shared.token_logprobs - per_row.token_logprobs).abs().max() <= 1e-5


def test_rows_of_a_group_with_different_prompts_are_refused():
    batch = group_batch(GROUPS, seed=4)
    other_length = dict(batch, prompt_lens=batch["prompt_lens"].clone())
    other_length["prompt_lens"][1] = 8
    other_tokens = dict(batch, input_ids=batch["input_ids"].clone())
    other_tokens["input_ids"][2, 3] = (other_tokens["input_ids"][2, 3] + 1) % VOCAB
    actor = make_actor("qwen3", True)
    for bad in (other_length, other_tokens):
        with pytest.raises(ValueError, match="share group id 7 but not their prompt"):
            logprobs(actor, bad)
        with pytest.raises(ValueError, match="share_prompts=false"):
            actor.train_step(split_micro_batches(bad, 4), pg_loss_fn(10))
    # Unshared scoring does not depend on the group structure at all.
    unshared = logprobs(make_actor("qwen3", False), other_tokens)
    assert unshared.token_logprobs.shape == batch["input_ids"].shape


def test_micro_batches_keep_groups_whole():
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])  # G = 3
    assert micro_batch_slices(9, 4) == [slice(0, 4), slice(4, 8), slice(8, 12)]
    assert micro_batch_slices(9, 4, groups) == [slice(0, 3), slice(3, 6), slice(6, 9)]
    assert micro_batch_slices(9, 6, groups) == [slice(0, 6), slice(6, 9)]
    assert micro_batch_slices(9, 1, groups) == [slice(0, 3), slice(3, 6), slice(6, 9)]
    batch = group_batch(GROUPS, seed=5)
    parts = split_micro_batches(batch, 5, batch["group_ids"])
    assert [len(p["input_ids"]) for p in parts] == [4, 3]
    assert all(len(set(p["group_ids"].tolist())) == 1 for p in parts)
