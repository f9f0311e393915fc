"""What a speculative generate reports beside its tokens (GenerateStats.spec_*): the acceptance
sum_v min(p, q) of each tested draft, at its absolute position and budget, the sequences
verified, and the draft/verify time split. The monitor bins them (spec/accept/...) and the
throughput controller reads them (control/throughput.py)."""

from tiny_lm import random_prompts

from sparrow.monitor.speedup_probe import measure_speedup
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams
from sparrow.rollout.speculative import SpeculativeConfig

FLOOR = 3  # num_sink 1 + num_recent 2: the smallest budget the engine runs


def make_engine(lm, schedule, k):
    cfg = EngineConfig(page_size=4, num_pages=256)
    spec = SpeculativeConfig(enabled=True, draft_tokens=k)
    return LLMEngine(lm.model, lm.tokenizer, cfg, schedule=schedule, speculative=spec)


def test_each_tested_draft_is_recorded_at_its_position_and_budget(lively_llama):
    """A draft equal to the target (budget past every page) is always accepted, so each round
    drafts k tokens after its input token and takes the bonus: the drafts sit at every position
    after the prefill's token but the bonus ones, each with acceptance 1."""
    k, rounds = 3, 5
    budget = lambda context: 1000 if context < 40 else 2000  # noqa: E731
    engine = make_engine(lively_llama, budget, k)
    prompt = random_prompts(lively_llama.model.config.vocab_size, [21], seed=3)[0]
    params = SamplingParams(temperature=0.0, max_tokens=1 + rounds * (k + 1), ignore_eos=True)
    engine.generate([prompt], params)
    stats = engine.last_stats
    drafts = stats.spec_accept
    # The prefill's token sits at 21; round r's input token at 21 + r (k + 1), its drafts next.
    expected = [21 + 1 + r * (k + 1) + i for r in range(rounds) for i in range(k)]
    assert drafts.positions == expected
    assert drafts.budget_pages == [budget(t) for t in expected]
    assert min(drafts.values) > 1 - 1e-5 and max(drafts.values) < 1 + 1e-5
    assert stats.spec_verified == rounds and stats.spec_rounds == rounds
    assert stats.spec_drafted == stats.spec_accepted == rounds * k
    assert stats.spec_draft_s > 0 and stats.spec_verify_s > 0


def test_the_recorded_acceptance_predicts_the_realised_acceptance_rate(lively_llama):
    """At the floor budget under sampling, each tested draft is kept with probability equal to
    its recorded sum_v min(p, q): the mean recorded acceptance matches the share of tested
    drafts kept (n ~ 1,000 tested drafts, 4 standard errors), and only drafts up to each
    round's first rejection are recorded."""
    engine = make_engine(lively_llama, lambda context: FLOOR, k=4)
    prompts = random_prompts(lively_llama.model.config.vocab_size, [30, 45, 60, 25], seed=7)
    params = SamplingParams(temperature=1.0, max_tokens=80, ignore_eos=True)
    engine.generate(prompts, params, n=4, seed=0)
    stats = engine.last_stats
    values = stats.spec_accept.values
    tested = len(values)
    # Every accepted draft was tested; a round with a rejection tested one draft more.
    assert (
        stats.spec_accepted
        < tested
        <= min(stats.spec_drafted, stats.spec_accepted + stats.spec_verified)
    )
    assert all(0.0 <= v <= 1.0 + 1e-6 for v in values)
    mean = sum(values) / tested
    kept = stats.spec_accepted / tested
    stderr = (mean * (1 - mean) / tested) ** 0.5
    assert 0.05 < mean < 0.95, mean  # the test needs rejections and acceptances both
    assert abs(mean - kept) < 4 * stderr + 0.01, (mean, kept, tested)


def test_the_speedup_probe_times_plain_dense_decode(lively_llama):
    """speedup/measured with speculative rollouts: their decode tok/s over plain dense decode's
    (no rounds in the dense arm), the engine left as it was."""
    engine = make_engine(lively_llama, lambda context: FLOOR, k=4)
    prompts = random_prompts(lively_llama.model.config.vocab_size, [30], seed=1)
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    engine.generate(prompts, params, n=2, seed=0)
    spec_stats = engine.last_stats
    speculative, schedule = engine.speculative, engine.schedule
    metrics = measure_speedup(engine, prompts, params, 2, spec_stats, seed=1)
    assert engine.last_stats.spec_rounds == 0 and engine.last_stats.decode_tokens > 0
    assert engine.speculative is speculative and engine.schedule is schedule
    assert metrics["speedup/sparse_decode_tok_s"] == spec_stats.decode_tok_s
