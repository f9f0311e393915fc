"""The monitor's exact acceptance from the logits the engine kept while sampling: the same
acceptance as from the engine's replay (<= 1e-5 per token) on a batch mixing sparse and dense
(noise-floor) rows, without calling `engine.score`; rows without kept logits are still replayed.
And the trainer keeps logits for exactly the rows the monitor measures and replays none."""

from dataclasses import replace

import pytest
import torch
import transformers

from sparrow.cli.config_loader import load_config
from sparrow.models.loading import ModelConfig, load_model, tiny_model_config
from sparrow.monitor.exact_acceptance import exact_batch_acceptance
from sparrow.rl.batch import collate_rollouts
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams
from sparrow.train.trainer import GRPOTrainer

TEMPERATURE = 0.7


def sparse(context_tokens: int) -> int:
    return 3  # pages of 4 tokens: decodes read 3 of them once the context passes 12 tokens


def spy_score(engine) -> list[int]:
    """Rows passed to each engine.score call, recorded on the engine."""
    calls = []
    score = engine.score

    def counting_score(prompts, completions, schedules=None):
        calls.append(len(prompts))
        return score(prompts, completions, schedules)

    engine.score = counting_score
    return calls


@pytest.fixture(scope="module")
def rollout():
    """A tiny Llama with large random weights (context-sensitive distributions), 3 prompts x 3
    samples of up to 10 tokens, stopping early on some tokens; the last prompt rolled out
    densely (the noise floor), the others under `sparse`; logits kept for every row."""
    tokenizer = load_model(ModelConfig("tiny-llama")).tokenizer
    config = tiny_model_config("llama", vocab_size=len(tokenizer))
    config.initializer_range = 0.2
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    engine = LLMEngine(model, tokenizer, EngineConfig(page_size=4, num_pages=128))
    gen = torch.Generator().manual_seed(31)
    prompts = [torch.randint(3, len(tokenizer), (n,), generator=gen).tolist() for n in (17, 11, 9)]
    schedules = [sparse] * 6 + [None] * 3
    params = SamplingParams(
        temperature=TEMPERATURE,
        max_tokens=10,
        stop_token_ids=tuple(range(3, 40)),
        return_logits=True,
    )
    outs = engine.generate(prompts, params, n=3, schedules=schedules)
    batch = collate_rollouts(prompts, outs, pad_token_id=0)
    return model, engine, batch, schedules


def test_kept_logits_give_the_replay_acceptance_without_a_replay(rollout):
    model, engine, batch, schedules = rollout
    assert len({int(n) for n in batch.completion_mask.sum(1)}) > 1  # unequal completions
    calls = spy_score(engine)
    try:
        kept = exact_batch_acceptance(engine, model, batch, TEMPERATURE, 4, schedules)
        assert calls == []  # no second decode pass
        replayed = exact_batch_acceptance(
            engine, model, replace(batch, rollout_logits=None), TEMPERATURE, 4, schedules
        )
        assert calls == [len(batch)]
    finally:
        del engine.score
    assert (kept - replayed).abs().max() <= 1e-5
    mask = batch.completion_mask
    assert kept[6:][mask[6:]].min() > 0.9999  # dense rollout vs the dense model: the floor
    assert kept[:6][mask[:6]].min() < 0.99  # the sparse rows really differ from dense


def test_rows_without_kept_logits_are_replayed_alone(rollout):
    model, engine, batch, schedules = rollout
    rows = torch.tensor([0, 2, 4, 6, 7, 8])
    sub = batch.select(rows)
    partial = [x if b % 2 else None for b, x in enumerate(sub.rollout_logits)]  # 3 of 6 kept
    sub_schedules = [schedules[b] for b in rows.tolist()]
    reference = exact_batch_acceptance(engine, model, sub, TEMPERATURE, 4, sub_schedules)
    calls = spy_score(engine)
    try:
        mixed = exact_batch_acceptance(
            engine, model, replace(sub, rollout_logits=partial), TEMPERATURE, 4, sub_schedules
        )
    finally:
        del engine.score
    assert calls == [3]  # one replay, of the rows without logits only
    assert (mixed - reference).abs().max() <= 1e-5


def test_trainer_keeps_logits_for_the_measured_rows_and_replays_none(tmp_path):
    cfg = load_config(
        [
            "preset=tiny",
            "rollout.engine.page_size=4",
            "schedule.mode=fixed",
            "schedule.budgets_pages=[3]",
            "rollout.max_new_tokens=12",
            "rl.eval.every=0",
            "monitor.exact=true",
            "monitor.exact_fraction=0.5",
            "monitor.noise_floor_fraction=0.25",
            f"run_dir={tmp_path}",
        ]
    )
    trainer = GRPOTrainer.from_config(cfg)
    kept = []
    generate = trainer.engine.generate

    def recording_generate(*args, **kwargs):
        outs = generate(*args, **kwargs)
        kept.append([o.logits is not None for o in outs])  # before the trainer frees them
        return outs

    trainer.engine.generate = recording_generate
    calls = spy_score(trainer.engine)
    metrics = trainer.train_step()
    assert calls == []
    # 4 prompts x 4 samples, the last prompt the noise floor: every 2nd row, and the floor's.
    assert kept[0] == [i % 2 == 0 or i >= 12 for i in range(16)]
    assert all(not any(k) for k in kept[1:])  # the timed dense probe keeps none
    assert metrics["noise_floor/p5_min"] > 0.9999  # the floor rows' kept logits are dense
    assert metrics["accept/p5_min"] < metrics["noise_floor/p5_min"]
