"""The monitor's exact acceptance with each group's prompt computed once, in the engine's replay
and in the dense model's pass: the same acceptance as scoring every row alone, with the prompt's
decoder tokens counted once per group and logits only at the completion positions."""

import pytest
import torch
import torch.nn.functional as F
import transformers

from sparrow.control.acceptance import exact_acceptance
from sparrow.models.loading import tiny_model_config
from sparrow.monitor.exact_acceptance import exact_batch_acceptance, prompt_runs
from sparrow.rl.batch import RolloutBatch
from sparrow.rollout.engine import EngineConfig, LLMEngine

PAGE = 4


def sparse(context_tokens: int) -> int:
    return 3  # pages of 4 tokens: decodes read 3 of them once the context passes 12 tokens


# (prompt length, completion lengths): prompts of different lengths, unequal completions, one of
# a single token. Row 1 replays densely (a noise-floor row), the others under `sparse`.
GROUPS = [(17, [6, 2, 9]), (11, [8, 1])]
SCHEDULES = [sparse, None, sparse, sparse, sparse]
TEMPERATURE = 0.7


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def lively(request):
    """A tiny model with large random weights (its distributions depend on the context, so a
    sparse replay differs from a dense one), untied for Qwen3 and tied for Llama, and an engine
    holding a copy of its weights."""
    config = tiny_model_config(request.param, vocab_size=256)
    config.initializer_range = 0.2
    config.tie_word_embeddings = request.param == "llama"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    return model, LLMEngine(model, None, EngineConfig(page_size=PAGE, num_pages=64))


def group_rows(groups, seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, completion) per row, consecutive per group, each group sharing a random prompt."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for prompt_len, completion_lens in groups:
        prompt = torch.randint(3, 256, (prompt_len,), generator=gen).tolist()
        for n in completion_lens:
            rows.append((prompt, torch.randint(3, 256, (n,), generator=gen).tolist()))
    return rows


def rollout_batch(rows: list[tuple[list[int], list[int]]]) -> RolloutBatch:
    """Right-padded rows (two columns of padding); fields the acceptance does not read are 0."""
    width = max(len(p) + len(c) for p, c in rows) + 2
    batch = len(rows)
    ids = torch.zeros(batch, width, dtype=torch.int64)  # (B, T)
    mask = torch.zeros(batch, width, dtype=torch.bool)  # (B, T)
    completion = torch.zeros(batch, width, dtype=torch.bool)  # (B, T)
    for b, (prompt, comp) in enumerate(rows):
        ids[b, : len(prompt) + len(comp)] = torch.tensor(prompt + comp)
        mask[b, : len(prompt) + len(comp)] = True
        completion[b, len(prompt) : len(prompt) + len(comp)] = True
    return RolloutBatch(
        input_ids=ids,
        attention_mask=mask,
        completion_mask=completion,
        prompt_lens=torch.tensor([len(p) for p, _ in rows]),
        sampled_logprobs=torch.zeros(batch, width),
        topk_ids=torch.zeros(batch, width, 1, dtype=torch.int64),
        topk_logprobs=torch.zeros(batch, width, 1),
        budget_pages=torch.zeros(batch, width, dtype=torch.int32),
        group_ids=torch.zeros(batch, dtype=torch.int64),
        finish_reasons=["length"] * batch,
    )


@torch.no_grad()
def per_row_acceptance(model, engine, rows, schedules) -> torch.Tensor:
    """The unshared reference: each row replayed alone and the full model's (T, V) logits."""
    batch = rollout_batch(rows)
    accept = torch.zeros(batch.input_ids.shape)  # (B, T)
    for b, (prompt, comp) in enumerate(rows):
        p0, n = len(prompt), len(comp)
        replay = engine.score([prompt], [comp], [schedules[b]])[0]  # (n, V)
        logits = model(input_ids=torch.tensor([prompt + comp])).logits[0]  # (p0 + n, V)
        dense = F.log_softmax(logits[p0 - 1 : p0 - 1 + n] / TEMPERATURE, -1)
        accept[b, p0 : p0 + n] = exact_acceptance(dense, F.log_softmax(replay / TEMPERATURE, -1))
    return accept


@pytest.mark.parametrize("micro_batch_size", [1, 5])  # a group per micro-batch / both in one
def test_shared_acceptance_equals_per_row(lively, micro_batch_size):
    model, engine = lively
    rows = group_rows(GROUPS, seed=1)
    shared = exact_batch_acceptance(
        engine, model, rollout_batch(rows), TEMPERATURE, micro_batch_size, SCHEDULES
    )
    reference = per_row_acceptance(model, engine, rows, SCHEDULES)
    assert (shared - reference).abs().max() <= 1e-5
    completion = rollout_batch(rows).completion_mask
    assert shared[1][completion[1]].min() > 0.9999  # dense replay vs dense model: the floor
    assert shared[completion].min() < 0.99  # the sparse rows really differ from dense


def test_rows_of_a_prompt_need_not_be_consecutive(lively):
    # A batch mixing groups: prompt A's rows split by one of B's. Each run of equal prompts is
    # computed once in the dense pass; the engine still prefills A once.
    model, engine = lively
    a0, a1, a2, b0, b1 = group_rows(GROUPS, seed=2)
    rows = [a0, a1, b0, a2, b1]
    assert prompt_runs([p for p, _ in rows]).tolist() == [0, 0, 1, 2, 3]
    shared = exact_batch_acceptance(engine, model, rollout_batch(rows), TEMPERATURE, 4, SCHEDULES)
    assert (shared - per_row_acceptance(model, engine, rows, SCHEDULES)).abs().max() <= 1e-5


def test_each_prompt_runs_once_and_logits_only_at_completions(lively):
    model, engine = lively
    rows = group_rows(GROUPS, seed=3)
    decoder_tokens, head_positions, prefill_tokens = [], [], []
    hooks = [
        model.get_input_embeddings().register_forward_hook(
            lambda mod, args, out: decoder_tokens.append(args[0].numel())
        ),
        model.get_output_embeddings().register_forward_hook(
            lambda mod, args, out: head_positions.append(args[0].shape[:-1].numel())
        ),
    ]
    prefill = engine.runner.model.prefill

    def counting_prefill(ids, *args, **kwargs):
        prefill_tokens.append(ids.numel())
        return prefill(ids, *args, **kwargs)

    engine.runner.model.prefill = counting_prefill
    try:
        exact_batch_acceptance(engine, model, rollout_batch(rows), TEMPERATURE, 4, SCHEDULES)
    finally:
        del engine.runner.model.prefill
        for hook in hooks:
            hook.remove()
    # Micro-batches of 4 rows hold one group each: its prompt P once, then every row's
    # completion minus its last token, padded to the group's longest: P + G (C_max - 1).
    assert sum(decoder_tokens) == (17 + 3 * 8) + (11 + 2 * 7)  # per row: sum(P + C) = 99
    assert sum(head_positions) == sum(len(c) for _, c in rows)  # per row: sum(P + C)
    assert sum(prefill_tokens) == 17 + 11  # the engine prefills each prompt once


@pytest.mark.slow  # DeepSpeed's ZeRO-3 start-up: ~70 s per actor on a loaded 2-core CPU
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_partitioned_actor_model_gives_the_same_acceptance(family):
    # The trainer passes the DeepSpeed actor's HF model: under ZeRO-3 its weights are
    # partitioned and gathered module by module as the decoder and the head are called.
    from sparrow.rl.actor import DenseActor
    from sparrow.rl.actor_config import ActorConfig

    config = tiny_model_config(family, vocab_size=256)
    config.initializer_range = 0.2
    config.tie_word_embeddings = family == "llama"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    engine = LLMEngine(model, None, EngineConfig(page_size=PAGE, num_pages=64))
    rows = group_rows(GROUPS, seed=4)
    reference = per_row_acceptance(model, engine, rows, SCHEDULES)
    actor = DenseActor(model, ActorConfig(zero_stage=3, precision="fp32", micro_batch_size=4))
    assert all(p.numel() == 0 for p in actor.model.parameters())  # partitioned away
    shared = exact_batch_acceptance(
        engine, actor.model, rollout_batch(rows), TEMPERATURE, 4, SCHEDULES
    )
    assert (shared - reference).abs().max() <= 1e-5


@pytest.mark.parametrize("share_prefix", [True, False])
def test_common_prefix_follows_the_actor_flag(lively, share_prefix):
    # Two groups whose prompts start with the same 10 tokens (a system prompt), in one
    # micro-batch: with the actor's share_prefix the 10 tokens run once, without it per group;
    # the acceptance is the per-row one either way.
    model, engine = lively
    rows = group_rows(GROUPS, seed=5)
    system = list(range(100, 110))
    rows = [(system + p, c) for p, c in rows]
    decoder_tokens = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda mod, args, out: decoder_tokens.append(args[0].numel())
    )
    try:
        shared = exact_batch_acceptance(
            engine, model, rollout_batch(rows), TEMPERATURE, 5, SCHEDULES, share_prefix
        )
    finally:
        hook.remove()
    assert (shared - per_row_acceptance(model, engine, rows, SCHEDULES)).abs().max() <= 1e-5
    # Prompts of 27 and 21 tokens: 10 once + (17, 11) padded to 17 per group, or (27, 21)
    # padded to 27 per group; then each row's completion minus its last token, padded to 8.
    prompts = 10 + 2 * 17 if share_prefix else 2 * 27
    assert sum(decoder_tokens) == prompts + 5 * 8
