"""The engine on the real SmolLM2-135M-Instruct (fp32) against transformers. Marked slow: each test
runs 128 decode steps of a 30-layer model (~10-20 s each on 2 idle CPU cores).

    OMP_NUM_THREADS=1 pytest tests/rollout/test_smollm2.py -m slow -s   # -s prints the numbers
"""

import pytest
import torch

from sparrow.models.loading import ModelConfig, load_model
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams

pytestmark = pytest.mark.slow

STORY = "Write a long story about a dragon who learns to bake bread."


@pytest.fixture(scope="module")
def smollm2():
    return load_model(ModelConfig("smollm2-135m-instruct"))


def chat_prompt(tokenizer, text):
    messages = [{"role": "user", "content": text}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    return list(ids["input_ids"])


# "onednn" GEMMs (pre-packed weights, the CPU throughput mode) reassociate fp32 sums: ~1e-4.
@pytest.mark.parametrize("linear_backend, tolerance", [("torch", 1e-4), ("onednn", 2e-4)])
def test_teacher_forced_logits_and_dense_acceptance_match_transformers(
    smollm2, linear_backend, tolerance
):
    model, tok = smollm2.model, smollm2.tokenizer
    engine = LLMEngine(model, tok, EngineConfig(num_pages=128, linear_backend=linear_backend))
    prompt = chat_prompt(tok, "Explain why the sky is blue.")
    params = SamplingParams(temperature=1.0, max_tokens=64, ignore_eos=True)
    outs = engine.generate([prompt], params, n=4)
    completions = [o.token_ids for o in outs]
    forced = torch.stack(engine.score([prompt] * 4, completions))  # (4, 64, V)
    with torch.no_grad():
        ids = torch.tensor([prompt + c for c in completions])
        ref = model(ids).logits[:, len(prompt) - 1 : -1].float()  # (4, 64, V)
    max_diff = (forced - ref).abs().max().item()
    p, q = ref.log_softmax(-1), forced.log_softmax(-1)
    acceptance = torch.minimum(p, q).exp().sum(-1).flatten()  # (256,) exact, full vocabulary
    p5 = torch.quantile(acceptance, 0.05).item()
    token_logprobs = p.gather(2, torch.tensor(completions)[..., None])[..., 0]  # (4, 64)
    recorded = torch.stack([o.logprobs for o in outs])
    print(
        f"\nSmolLM2 dense engine ({linear_backend} GEMMs) vs HF fp32: max |logit diff| "
        f"{max_diff:.2e}; acceptance over "
        f"{acceptance.numel()} tokens: p5 {p5:.6f} mean {acceptance.mean():.6f} "
        f"min {acceptance.min():.6f}; recorded log-prob max diff "
        f"{(recorded - token_logprobs).abs().max():.2e}"
    )
    assert max_diff <= tolerance
    assert p5 >= 0.999
    assert torch.allclose(recorded, token_logprobs, atol=1e-4)


def test_greedy_generation_matches_hf_generate_for_128_tokens(smollm2):
    model, tok = smollm2.model, smollm2.tokenizer
    engine = LLMEngine(model, tok, EngineConfig(num_pages=64))
    prompt = chat_prompt(tok, STORY)
    out = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=128))[0]
    with torch.no_grad():
        ref = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=128,
            eos_token_id=list(engine.eos_token_ids),
            pad_token_id=tok.pad_token_id,
        )[0, len(prompt) :].tolist()
    assert len(ref) == 128 and out.finish_reason == "length"  # the story does not end early
    assert out.token_ids == ref
