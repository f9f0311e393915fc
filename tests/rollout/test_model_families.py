"""The engine on each model family it runs beyond Llama/Qwen3 (sparrow.models.families): Qwen2
with tied and untied embeddings, Mistral. Greedy generation equals HF `generate` token for token
(dense, and through the selection path with a budget that keeps every page), and with a real
budget equals a greedy loop over HF's forward with the masked block-sparse reference attention;
4 prompts sharing a 3-page prefix, 2 samples each."""

import copy

import pytest
import torch
import torch.nn.functional as F
from tiny_lm import random_model

from sparrow.distill.attention_reference import register_reference_attention
from sparrow.distill.sparse_attention import SparseForwardMetadata
from sparrow.models.loading import tiny_model_config, tiny_tokenizer
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams

VARIANTS = {
    "qwen2": ("qwen2", {}),
    "qwen2-untied": ("qwen2", {"tie_word_embeddings": False}),
    "mistral": ("mistral", {}),
}
PAGE = 4
BUDGET_PAGES = 4  # of up to 10 pages (prompts of 13-21 tokens + 16 completion tokens)
ALL_PAGES = 1000
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module", params=list(VARIANTS))
def lively(request, tokenizer):
    """The family's tiny config with large random weights and biases (init range 0.2): greedy
    outputs depend on the context, so wrong K/V or a dropped weight changes tokens."""
    family, fields = VARIANTS[request.param]
    config = tiny_model_config(family, vocab_size=len(tokenizer), **fields)
    config.initializer_range = 0.2
    return random_model(config, seed=0)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(3, len(tokenizer), (12,), generator=g).tolist()  # 3 whole pages
    return [
        shared + torch.randint(3, len(tokenizer), (n,), generator=g).tolist() for n in (5, 9, 1, 7)
    ]


def make_engine(model, tokenizer, **overrides):
    cfg = EngineConfig(**{"page_size": PAGE, "num_pages": 128, "dense_layers": (0,), **overrides})
    return LLMEngine(model, tokenizer, cfg)


def hf_generate(model, prompt: list[int], eos_ids) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=GREEDY.max_tokens,
            eos_token_id=list(eos_ids),
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def masked_reference_greedy(model, attn, prompt: list[int], tokens: list[int]) -> list[int]:
    """What greedy decoding with HF's forward and the masked block-sparse attention picks after
    each prefix of `tokens` (one teacher-forced forward: equal to `tokens` iff a greedy loop over
    that forward gives `tokens`). Decoding queries read BUDGET_PAGES pages in the sparse layers,
    as the engine's decode steps; the last prompt position (its prefill) reads all its pages."""
    ids = torch.tensor([prompt + tokens[:-1]])  # (1, T)
    positions = torch.arange(ids.shape[1])  # (T,)
    dense = positions // PAGE + 1  # ceil((t + 1) / PAGE)
    budgets = torch.where(positions >= len(prompt), BUDGET_PAGES, dense)  # (T,)
    meta = SparseForwardMetadata(attn, budgets[None])
    with torch.no_grad():
        logits = model(ids, sparrow_sparse=meta).logits[0, len(prompt) - 1 :]  # (len(tokens), V)
    return logits.argmax(-1).tolist()


@pytest.fixture(scope="module")
def hf_greedy(lively, tokenizer, prompts) -> list[list[int]]:
    """HF generate's greedy completion of each prompt (EOS stops it, as it stops the engine)."""
    eos_ids = make_engine(lively, tokenizer).eos_token_ids
    return [hf_generate(lively, prompt, eos_ids) for prompt in prompts]


def test_dense_greedy_equals_hf_generate(lively, tokenizer, prompts, hf_greedy):
    engine = make_engine(lively, tokenizer)
    outs = engine.generate(prompts, GREEDY, n=2)
    assert engine.last_stats.prefill_tokens == 12 + 5 + 9 + 1 + 7  # the prefix ran once
    for i, ref in enumerate(hf_greedy):
        assert outs[2 * i].token_ids == ref and outs[2 * i + 1].token_ids == ref, i
    assert sum(len(o.token_ids) for o in outs) >= 8 * 8  # EOS does not cut the comparison short
    assert len({tuple(o.token_ids) for o in outs}) == 4  # the model is context-sensitive


def test_sparse_greedy_equals_hf_and_the_masked_reference(lively, tokenizer, prompts, hf_greedy):
    """Sample 0 of each prompt keeps every page (budget >= pages, through the selection path
    because sample 1 of the same steps is sparse): HF generate. Sample 1 reads 4 pages: the
    masked-attention reference."""
    engine = make_engine(lively, tokenizer)
    keep_all, tight = (lambda context: ALL_PAGES), (lambda context: BUDGET_PAGES)
    outs = engine.generate(prompts, GREEDY, n=2, schedules=[keep_all, tight] * len(prompts))
    reference = copy.deepcopy(lively)
    reference.set_attn_implementation(register_reference_attention())
    differs = 0
    for i, prompt in enumerate(prompts):
        full, sparse = outs[2 * i], outs[2 * i + 1]
        assert full.token_ids == hf_greedy[i], i
        attn = engine.runner.kv.cfg
        assert sparse.token_ids == masked_reference_greedy(
            reference, attn, prompt, sparse.token_ids
        )
        if sparse.finish_reason != "eos":
            assert len(sparse.token_ids) == GREEDY.max_tokens
        pages = (sparse.context_lens + PAGE - 1) // PAGE
        assert (sparse.budget_pages < pages).sum() >= 8, i  # the budget really drops pages
        differs += sparse.token_ids != full.token_ids
    assert differs >= 2  # and that changes what greedy decoding picks


def test_sparse_logprobs_equal_the_masked_reference(lively, tokenizer, prompts):
    """Sampled (temperature 1) sparse rollouts: the recorded log-probs are the masked reference's
    teacher-forced ones, with the recorded budgets (fp32 reassociation only)."""
    engine = make_engine(lively, tokenizer, seed=3)
    engine.set_schedule(lambda context: BUDGET_PAGES)
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    outs = engine.generate(prompts, params, n=2)
    reference = copy.deepcopy(lively)
    reference.set_attn_implementation(register_reference_attention())
    worst = 0.0
    for out in outs:
        ids = torch.tensor(out.prompt_ids + out.token_ids)  # (T,)
        positions = torch.arange(len(ids) - 1)  # queries predicting tokens 1..T-1
        p = len(out.prompt_ids)
        budgets = positions // PAGE + 1  # dense: ceil((t + 1) / PAGE)
        budgets[p - 1 :] = out.budget_pages  # query t predicts token t + 1 with its budget
        meta = SparseForwardMetadata(engine.runner.kv.cfg, F.pad(budgets, (0, 1), value=1)[None])
        with torch.no_grad():
            logits = reference(ids[None], sparrow_sparse=meta).logits[0, p - 1 : -1]
        expected = logits.float().log_softmax(-1).gather(-1, ids[p:, None])[:, 0]
        worst = max(worst, (out.logprobs - expected).abs().max().item())
    print(f"max |engine - masked reference| log-prob: {worst:.1e}")
    assert worst < 5e-5, worst


def test_mistral_window_at_least_the_context_equals_hf(tokenizer, prompts):
    """A Mistral sliding window >= the engine's context (pool 128 x 4 = 512 tokens) is taken,
    and HF (which applies it) agrees; a shorter one is refused in one line naming it."""
    config = tiny_model_config("mistral", vocab_size=len(tokenizer), sliding_window=512)
    config.initializer_range = 0.2
    model = random_model(config, seed=2)
    engine = make_engine(model, tokenizer)
    outs = engine.generate(prompts[:2], GREEDY)
    for out, prompt in zip(outs, prompts[:2], strict=True):
        assert out.token_ids == hf_generate(model, prompt, engine.eos_token_ids)
    model.config.sliding_window = 511
    with pytest.raises(
        ValueError,
        match=r"^mistral: sliding_window=511 is shorter than the run's 512-token context "
        r"\(rollout.engine.num_pages x page_size",
    ):
        make_engine(model, tokenizer)
    make_engine(model, tokenizer, num_pages=127)  # 508 tokens: within the window


def test_mistral_window_a_call_would_exceed_is_refused_in_the_call(tokenizer, prompts):
    """A window at least the model's positions passes the engine's construction (the CLIs hold
    every sequence to the positions), but the engine API holds no prompt to them: a call with a
    prompt + max_tokens (or + scored completion) over the window, which HF would attend over only
    the last 20 tokens of, is refused in one line; a call within the window equals HF."""
    config = tiny_model_config(
        "mistral", vocab_size=len(tokenizer), sliding_window=20, max_position_embeddings=20
    )
    config.initializer_range = 0.2
    model = random_model(config, seed=2)
    engine = make_engine(model, tokenizer)  # a 512-token pool: construction checks 20 positions
    short, long = prompts[0], prompts[1] + prompts[3]  # 17 and 40 tokens
    full = copy.deepcopy(model)
    full.config.sliding_window = None
    with torch.no_grad():
        hf_short, hf_long, full_long = (
            m(torch.tensor([p])).logits[0, -1]
            for m, p in ((model, short), (model, long), (full, long))
        )
    # What is refused matters: HF's window changes the long prompt's first-token logits.
    assert (hf_long - full_long).abs().max() > 1.0
    params = SamplingParams(temperature=0.0, max_tokens=3, return_logits=True)
    out = engine.generate([short], params)[0]  # 17 + 3 tokens: within the window
    torch.testing.assert_close(out.logits[0], hf_short, rtol=0, atol=1e-4)
    with pytest.raises(ValueError) as e:
        engine.generate([short, long], params)
    assert str(e.value) == (
        "mistral: sliding_window=20 is shorter than the 43 tokens of prompt 1 (40) + its "
        "max_tokens (3), and sparrow attends over the whole context: use a checkpoint with "
        "sliding_window: null, or a prompt + max_tokens of at most 20 tokens"
    )
    with pytest.raises(ValueError, match=r"^mistral: sliding_window=20 is shorter than the 21 "):
        engine.score([short], [[5, 6, 7, 8]])
    assert len(engine.score([short], [[5, 6, 7]])[0]) == 3  # 20 tokens: within the window
