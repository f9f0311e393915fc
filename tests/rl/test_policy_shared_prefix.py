"""The group-shared log-prob pass with the prefix common to all groups of a micro-batch computed
once (share_prefix): the same log-probs, top-k, entropy and gradient as scoring every row's full
sequence, for prefixes of many tokens, of none, one group, and a prompt one token past it."""

import pytest
import torch
from tiny_lm import VOCAB, grouped_batch, tiny_causal_lm

from sparrow.rl.policy_logprobs import PolicyWithLogprobs
from sparrow.rl.shared_prompt_passes import common_prefix_len

PREFIX = 12
# Per case: the common prefix length, then per group its own prompt tokens after it (the first
# own token differs between groups unless noted) and its completion lengths.
CASES = {
    # three groups on a 12-token prefix; completions of one token; a tail of one token
    "prefix": (PREFIX, [([3, 7], [4, 1, 6]), ([5], [2, 5]), ([8, 2, 9, 4], [3, 3, 1])]),
    # the first tokens differ: nothing is shared, the pass runs on a masked stand-in token
    "no_prefix": (0, [([11, 3, 7, 2], [4, 2]), ([12, 5], [3, 1, 2])]),
    "one_group": (PREFIX, [([6], [5, 2, 3, 1])]),
    # one prompt is exactly the prefix plus one token, which the other prompt also continues
    # with: the shared prefix stops short of it, so every group keeps a token of its own
    "prefix_plus_one": (PREFIX, [([5], [2, 4]), ([5, 9, 8], [3, 1])]),
}


def prefix_batch(prefix_len: int, groups, seed: int) -> dict[str, torch.Tensor]:
    """Right-padded rows, consecutive per group; every prompt starts with one random prefix."""
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(20, VOCAB, (prefix_len,), generator=gen)
    prompts = [torch.cat([prefix, torch.tensor(own)]) for own, _ in groups]
    return grouped_batch(prompts, [lens for _, lens in groups], gen, first_id=3)


def scores(policy: PolicyWithLogprobs, batch: dict, shared: bool, temperature: float = 0.7):
    groups = (batch["prompt_lens"], batch["group_ids"]) if shared else ()
    return policy(batch["input_ids"], batch["attention_mask"], 4, temperature, *groups)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("case", list(CASES))
def test_shared_prefix_scores_equal_per_row(family, case):
    prefix_len, groups = CASES[case]
    batch = prefix_batch(prefix_len, groups, seed=1)
    first_rows = torch.tensor([0] + [len(g[1]) for g in groups[:-1]]).cumsum(0)
    group_prompts = batch["input_ids"][first_rows, : int(batch["prompt_lens"].max())]
    expected = prefix_len if len(groups) > 1 else int(batch["prompt_lens"][0]) - 1
    assert common_prefix_len(group_prompts, batch["prompt_lens"][first_rows]) == expected
    # chunk_tokens 5: the lm_head runs in several chunks over the prefix as over the rest
    policy = PolicyWithLogprobs(tiny_causal_lm(family), 5, share_prefix=True)
    with torch.no_grad():
        per_row = scores(policy, batch, shared=False)
        shared = scores(policy, batch, shared=True)
    names = ("token_logprobs", "topk_ids", "topk_logprobs", "entropy")
    for name, a, b in zip(names, shared, per_row, strict=True):
        assert a.shape == b.shape, name
        if name == "topk_ids":
            assert torch.equal(a, b)
        else:
            assert (a - b).abs().max() <= 1e-5, (name, float((a - b).abs().max()))
    scored = batch["attention_mask"].clone()
    scored[:, 0] = False
    assert (shared[0][scored] < 0).all()  # prompt (prefix included) and completion positions
    assert shared[0][~scored].abs().max() == 0


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("case", ["prefix", "no_prefix"])
def test_shared_prefix_gradient_equals_per_row(family, case):
    """A policy-gradient loss over completion log-probs (plus a small term over prompt
    positions, which reach the prefix's scores expanded to every group): same parameter
    gradients as per row, the prefix's K/V receiving every group's gradient."""
    batch = prefix_batch(*CASES[case], seed=2)
    completion = batch["completion_mask"].float()  # (B, T)
    prompt = (batch["attention_mask"] & ~batch["completion_mask"]).float()  # (B, T)
    grads = {}
    for shared in (False, True):
        policy = PolicyWithLogprobs(tiny_causal_lm(family), 5, share_prefix=True)
        token_logprobs = scores(policy, batch, shared, temperature=1.0)[0]  # (B, T)
        loss = -(batch["advantages"][:, None] * token_logprobs * completion).sum()
        (loss - 0.1 * (token_logprobs * prompt).sum()).backward()
        grads[shared] = {n: p.grad.clone() for n, p in policy.named_parameters()}
    for name, grad in grads[False].items():
        scale = grad.abs().max().clamp_min(1e-12)
        assert grad.abs().max() > 0, name
        assert (grads[True][name] - grad).abs().max() / scale <= 1e-5, name


@pytest.mark.parametrize(
    ("case", "share_prefix", "calls"),
    [
        # prefix (1, 12); own prompt tokens (3, 4); completions fed (8, 5)
        ("prefix", True, [(1, 12), (3, 4), (8, 5)]),
        ("prefix", False, [(3, 16), (8, 5)]),
        # no common token: a one-token stand-in keeps the pass, as on every other rank
        ("no_prefix", True, [(1, 1), (2, 4), (5, 3)]),
        ("one_group", True, [(1, 12), (1, 1), (4, 4)]),
    ],
)
def test_decoder_passes(case, share_prefix, calls):
    """The prefix pass runs whenever share_prefix is on, whatever the data (ZeRO-3 gathers
    weights per module call, so every rank must make the same calls), and not when off."""
    model = tiny_causal_lm("qwen3")
    seen = []
    model.get_input_embeddings().register_forward_hook(
        lambda mod, inp, out: seen.append(tuple(inp[0].shape))
    )
    policy = PolicyWithLogprobs(model, 1024, share_prefix=share_prefix)
    with torch.no_grad():
        scores(policy, prefix_batch(*CASES[case], seed=3), shared=True)
    assert seen == calls
