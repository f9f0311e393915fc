"""Exactness (c) of speculative rollouts under sampling: the first-token and two-token marginals
of speculative rollouts from a tiny model are the dense policy's, while today's approximate
sparse mode at a one-page budget is rejected by the same test (so the test has power).

The test: Pearson's chi-square goodness of fit of n = 4,000 rollouts per arm against the dense
policy's exact law, enumerated from a dense `score` of every reachable prefix (temperature 0.8
and top-k 6 keep each position's law on 6 tokens: 6^4 prefixes); cells expected below 5 counts
are pooled into one. Three statistics per arm: the first token a speculative round decides
(position 1; position 0 is the prompt's dense prefill in every arm), the pair at positions
(1, 2) (two drafts of one round), and the pair (2, 3) (the second draft and the bonus token
when both stand). Family-wise alpha = 1e-3, Bonferroni over the three: each p > 3.3e-4 for the
speculative arm (k = 2, drafts at a one-page budget: most drafts are rejected, so the residual,
the bonus and the next round's first token all carry mass) and for dense rollouts (which checks
the enumerated law itself), each p < 3.3e-4 for the one-page sparse arm.

    pytest tests/rollout/test_speculative_marginals.py -m slow -s   # -s prints the p-values
"""

import pytest
import torch
from tiny_lm import random_prompts

from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams
from sparrow.rollout.sampler import Distributions
from sparrow.rollout.speculative import SpeculativeConfig

pytestmark = pytest.mark.slow  # 3 x 4,000 rollouts: minutes on a loaded 2-core CPU

N = 4000
ALPHA = 1e-3 / 3  # family-wise 1e-3, Bonferroni over the three statistics
STATISTICS = [(1,), (1, 2), (2, 3)]
PARAMS = SamplingParams(temperature=0.8, top_k=6, max_tokens=4, ignore_eos=True)


def make_engine(lm, budget, k=None):
    """4-token pages, a one-page floor (no sink, the newest page only)."""
    cfg = EngineConfig(page_size=4, num_pages=4096, max_batch_size=256, num_sink=0, num_recent=1)
    schedule = None if budget is None else (lambda context: budget)
    spec = None if k is None else SpeculativeConfig(enabled=True, draft_tokens=k)
    return LLMEngine(lm.model, lm.tokenizer, cfg, schedule=schedule, speculative=spec)


def exact_law(engine: LLMEngine, prompt: list[int], depth: int) -> dict[tuple, float]:
    """P(y_0..y_{depth-1}) of dense sampling under PARAMS, over every reachable prefix: each
    prefix's next-token law from a dense score (teacher-forced logits at its last position)."""
    law: dict[tuple, float] = {(): 1.0}
    for _ in range(depth):
        prefixes = list(law)
        scored = engine.score([prompt] * len(prefixes), [[*c, 0] for c in prefixes])
        last = torch.stack([logits[-1] for logits in scored])  # (prefixes, V)
        probs = Distributions(last, PARAMS.temperature, PARAMS.top_p, PARAMS.top_k).probs()
        law = {
            (*c, y): law[c] * float(p[y])
            for c, p in zip(prefixes, probs.double(), strict=True)
            for y in p.nonzero()[:, 0].tolist()
        }
    return law


def goodness_of_fit_p(samples: list[list[int]], law: dict[tuple, float], idx: tuple) -> float:
    """p-value of Pearson's statistic for the samples' tokens at positions `idx` against the
    marginal of `law` there; cells expected below 5 counts pooled into one."""
    marginal: dict[tuple, float] = {}
    for prefix, prob in law.items():
        key = tuple(prefix[i] for i in idx)
        marginal[key] = marginal.get(key, 0.0) + prob
    observed: dict[tuple, int] = {}
    for tokens in samples:
        key = tuple(tokens[i] for i in idx)
        observed[key] = observed.get(key, 0) + 1
    n = len(samples)
    cells = [key for key, prob in marginal.items() if prob * n >= 5]
    obs = [observed.get(key, 0) for key in cells]
    exp = [marginal[key] * n for key in cells]
    rest_obs, rest_exp = n - sum(obs), n - sum(exp)
    if rest_exp >= 5:
        obs, exp = obs + [rest_obs], exp + [rest_exp]
    else:  # too little to stand alone: joined to the smallest cell
        obs[-1] += rest_obs
        exp[-1] += rest_exp
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))
    df = torch.tensor((len(obs) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, torch.tensor(stat / 2, dtype=torch.float64)))


def test_speculative_marginals_are_the_dense_policys_and_sparse_ones_are_not(lively_llama):
    vocab = lively_llama.model.config.vocab_size
    prompt = random_prompts(vocab, [61], seed=4)[0]  # 16 pages
    law = exact_law(make_engine(lively_llama, None), prompt, depth=PARAMS.max_tokens)
    p_values = {}
    for arm, budget, k in [("dense", None, None), ("speculative", 1, 2), ("sparse", 1, None)]:
        engine = make_engine(lively_llama, budget, k)
        outs = engine.generate([prompt], PARAMS, n=N, seed=7)
        samples = [o.token_ids for o in outs]
        p_values[arm] = [goodness_of_fit_p(samples, law, idx) for idx in STATISTICS]
        if arm == "speculative":
            stats = engine.last_stats
            print(f"\nspeculative acceptance {stats.spec_accepted}/{stats.spec_drafted}")
            assert stats.spec_accepted < 0.9 * stats.spec_drafted  # the residual path is hot
    print({arm: [f"{p:.1e}" for p in ps] for arm, ps in p_values.items()})
    assert min(p_values["speculative"]) > ALPHA, p_values
    assert min(p_values["dense"]) > ALPHA, p_values
    assert max(p_values["sparse"]) < ALPHA, p_values
