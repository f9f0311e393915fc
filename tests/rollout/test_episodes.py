"""Multi-turn episodes (rollout/episodes.py) on a tiny model and a scripted environment: the
sequence is exactly the sampled tokens plus the observations, turn 2 continues on the cached K/V
(only the observation's chunk is computed) under the sparse schedule at its true positions, and
the limits end or cut episodes as documented."""

import copy

import pytest
import torch

from sparrow.models.loading import LoadedModel
from sparrow.rollout.engine import EngineConfig, LLMEngine, SamplingParams
from sparrow.rollout.episodes import EpisodeLimits, run_episodes
from sparrow.tasks.environment import Observation as Obs
from sparrow.tasks.environment import capped_observation_ids


class ScriptedEnv:
    """Answers every turn with a tool message of `words` words; done after `turns` turns
    (never when None); reward 1 per turn; logs what it was given."""

    tools: list = []

    def __init__(self, turns: int | None, words: int = 6, tag: int = 0):
        self.turns, self.words, self.tag = turns, words, tag
        self.seen: list[str] = []

    def reset(self) -> list[dict]:
        return [{"role": "user", "content": f"What is {self.tag} plus {self.tag}?"}]

    def answer(self, turn: int) -> str:
        return " ".join(["number"] * self.words) + f" {turn}"

    def step(self, text: str) -> Obs:
        self.seen.append(text)
        done = self.turns is not None and len(self.seen) >= self.turns
        messages = [] if done else [{"role": "tool", "content": self.answer(len(self.seen))}]
        return Obs(messages, done, reward=1.0, tool_calls=1, tool_errors=len(self.seen) % 2)


class Observer:
    """The chat template's delta after an assistant turn (tasks/environment.py), logged."""

    def __init__(self, tokenizer):
        self.tokenizer, self.given = tokenizer, []

    def __call__(self, messages: list[dict], max_tokens: int) -> tuple[list[int], int]:
        ids, cut = capped_observation_ids(self.tokenizer, messages, max_tokens)
        self.given.append(ids)
        return ids, cut


def engine_for(lm, schedule=None, **cfg):
    config = EngineConfig(**{"page_size": 16, "num_pages": 256, "num_recent": 1, **cfg})
    return LLMEngine(lm.model, lm.tokenizer, config, schedule=schedule)


def first_prompt(tokenizer, env) -> list[int]:
    text = tokenizer.apply_chat_template(env.reset(), add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def params(lm, max_tokens=24, stop_every=2) -> SamplingParams:
    # A random model rarely samples <|im_end|>: every `stop_every`-th id closes a turn instead.
    stops = tuple(range(0, len(lm.tokenizer), stop_every))
    return SamplingParams(temperature=1.0, max_tokens=max_tokens, stop_token_ids=stops)


def run(lm, envs, n=1, limits=None, schedule=None, max_tokens=24, stop_every=2, **cfg):
    engine = engine_for(lm, schedule, **cfg)
    prompts = [first_prompt(lm.tokenizer, e) for e in envs[::n]]
    observe = Observer(lm.tokenizer)
    outs = run_episodes(
        engine,
        prompts,
        envs,
        observe,
        params(lm, max_tokens, stop_every),
        limits or EpisodeLimits(),
        n=n,
    )
    return engine, outs, observe


def segments(out):
    """[(is_observation, token ids)] runs of the episode's completion."""
    runs, mask = [], out.observation_mask.tolist()
    for t, m in zip(out.token_ids, mask, strict=True):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(t)
        else:
            runs.append((m, [t]))
    return runs


def test_episode_is_the_sampled_turns_and_the_observations_token_for_token(lively_llama):
    tok = lively_llama.tokenizer
    envs = [ScriptedEnv(turns=t, tag=i) for i, t in enumerate([1, 2, 3, 3, 2, 4])]
    _, outs, observe = run(lively_llama, envs, n=2, limits=EpisodeLimits(max_turns=4))
    given = iter(observe.given)
    for out, env in zip(outs, envs, strict=True):
        runs = segments(out)
        turns = [ids for is_obs, ids in runs if not is_obs]
        observations = [ids for is_obs, ids in runs if is_obs]
        assert out.episode.turns == len(env.seen) == len(turns)
        # What the environment read is each sampled turn; what follows it is what it answered.
        assert [tok.decode(t, skip_special_tokens=True) for t in turns] == env.seen
        assert out.episode.observation_tokens == sum(map(len, observations))
        assert out.episode.reward == float(len(env.seen))
        assert out.episode.tool_errors == sum(k % 2 for k in range(1, len(env.seen) + 1))
        # Observation positions carry no record of a sampled token.
        obs = out.observation_mask
        assert (out.logprobs[obs] == 0).all() and (out.budget_pages[obs] == 0).all()
        assert (out.logprobs[~obs] < 0).all()
        assert all(len(turn) >= 1 for turn in turns)
    # Episodes ran side by side: each observation was used as the observer returned it.
    used = sorted(tuple(ids) for o in outs for m, ids in segments(o) if m)
    assert used == sorted(tuple(next(given)) for _ in range(len(observe.given)))
    assert [o.episode.turns for o in outs] == [1, 2, 3, 3, 2, 4]


def test_model_token_logprobs_equal_a_one_shot_score_of_the_whole_sequence(lively_llama):
    envs = [ScriptedEnv(turns=3, words=9, tag=i) for i in range(4)]
    engine, outs, _ = run(lively_llama, envs, n=2)
    assert max(o.episode.turns for o in outs) == 3
    scored = engine.score([o.prompt_ids for o in outs], [o.token_ids for o in outs])
    for out, logits in zip(outs, scored, strict=True):
        model = ~out.observation_mask
        ids = torch.tensor(out.token_ids)
        one_shot = logits.log_softmax(-1).gather(1, ids[:, None])[:, 0]  # (T,)
        torch.testing.assert_close(out.logprobs[model], one_shot[model], atol=2e-4, rtol=0)
        # and the HF model's forward of the whole token sequence
        full = torch.tensor([out.prompt_ids + out.token_ids])
        with torch.no_grad():
            hf = lively_llama.model(full).logits[0].float().log_softmax(-1)  # (L, V)
        p = len(out.prompt_ids)
        hf_lp = hf[p - 1 : -1].gather(1, ids[:, None])[:, 0]
        torch.testing.assert_close(out.logprobs[model], hf_lp[model], atol=2e-4, rtol=0)


def test_turn_two_continues_on_the_cached_kv_with_sparse_decode(lively_llama):
    # Long observations put turn 2 past 6 pages; a 4-page budget makes its decode sparse.
    envs = [ScriptedEnv(turns=2, words=60, tag=i) for i in range(4)]
    engine, outs, observe = run(
        lively_llama, envs, schedule=lambda context: 4, max_tokens=24, stop_every=5, num_sink=1
    )
    long_turns = 0
    prompt_tokens = sum(len(o.prompt_ids) for o in outs)
    for out in outs:
        (_, turn1), (_, obs), (_, turn2) = segments(out)[:3]
        # Turn 2's chunk: the observation plus turn 1's closing token (sampled, never cached).
        assert out.episode.chunk_tokens == [len(obs) + 1]
        p = len(out.prompt_ids)
        start = len(turn1) + len(obs)
        # Turn 2's tokens were produced at their true positions ...
        expected = torch.arange(p + start, p + start + len(turn2), dtype=torch.int32)
        assert torch.equal(out.context_lens[start : start + len(turn2)], expected)
        # ... its first token from the chunk (dense), then sparse decode under the budget.
        pages = -(-out.context_lens[start : start + len(turn2)] // 16)
        read = out.budget_pages[start : start + len(turn2)]
        assert read[0] == pages[0] and (read[1:] == 4).all() and (pages > 4).all()
        long_turns += len(turn2) > 1
    assert long_turns >= 2
    # Prefill work: the prompts once, then each chunk; never the history again.
    chunks = sum(sum(o.episode.chunk_tokens) for o in outs)
    assert engine.last_stats.prefill_tokens == prompt_tokens + chunks
    assert engine.last_stats.num_preemptions == 0


def test_limits_end_or_cut_episodes(lively_llama):
    tok = lively_llama.tokenizer
    # max_turns: an environment that never says done gets exactly max_turns turns.
    _, outs, _ = run(lively_llama, [ScriptedEnv(turns=None)], limits=EpisodeLimits(max_turns=3))
    assert outs[0].episode.turns == 3 and outs[0].finish_reason in ("stop", "eos")
    # max_observation_tokens: a 200-word answer is cut to 40 tokens, its content marked and the
    # next assistant header kept.
    limits = EpisodeLimits(max_turns=2, max_observation_tokens=40)
    _, outs, _ = run(lively_llama, [ScriptedEnv(turns=2, words=200)], limits=limits)
    obs = [ids for m, ids in segments(outs[0]) if m][0]
    assert len(obs) <= 40 and outs[0].episode.truncated_observations == 1
    text = tok.decode(obs)
    assert "tokens cut]" in text and text.endswith("<|im_start|>assistant\n")
    # The context limit: an observation that leaves no room ends the episode as overlong.
    limits = EpisodeLimits(max_turns=4, max_context_tokens=60)
    _, outs, _ = run(lively_llama, [ScriptedEnv(turns=4, words=30)], limits=limits)
    assert outs[0].finish_reason == "length"
    assert len(outs[0].prompt_ids) + len(outs[0].token_ids) <= 60


def test_episodes_survive_preemption(lively_llama):
    # A 14-page pool cannot hold six growing episodes at once: some are recomputed by a prefill
    # over their whole token sequence, observations included.
    envs = [ScriptedEnv(turns=3, words=20, tag=i) for i in range(6)]
    limits = EpisodeLimits(max_context_tokens=150)
    engine, outs, _ = run(lively_llama, envs, limits=limits, max_tokens=16, num_pages=14)
    assert engine.last_stats.num_preemptions > 0
    for out, env in zip(outs, envs, strict=True):
        turns = [ids for m, ids in segments(out) if not m]
        assert [lively_llama.tokenizer.decode(t, skip_special_tokens=True) for t in turns] == (
            env.seen
        )


def test_mismatched_environments_are_refused(lively_llama):
    engine = engine_for(lively_llama)
    with pytest.raises(ValueError, match="2 environments for 3 episodes"):
        run_episodes(
            engine, [[1, 2]], [ScriptedEnv(1)] * 2, None, params(lively_llama), EpisodeLimits(), n=3
        )


# DeepSeek-R1's way: the generation prompt opens the think block, and earlier assistant turns are
# rendered with their reasoning (and that opener) stripped.
THINK_TEMPLATE = (
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}"
)


def test_rerendering_the_history_through_a_think_template_is_not_what_was_sampled(lively_llama):
    """The episode's tokens are the prompt, each sampled turn and each observation, so every turn
    was sampled after the template's `<think>` opener; re-rendering the conversation through the
    same template (what the trainer must never do) drops those openers: other tokens."""
    tok = copy.deepcopy(lively_llama.tokenizer)
    tok.chat_template = THINK_TEMPLATE
    lm = LoadedModel(lively_llama.model, tok)
    envs = [ScriptedEnv(turns=2, words=5, tag=i) for i in range(3)]
    _, outs, _ = run(lm, envs)
    for out, env in zip(outs, envs, strict=True):
        sequence = out.prompt_ids + out.token_ids
        assert out.episode.turns == 2 and tok.decode(sequence).count("<think>\n") == 2
        messages = env.reset()
        for k, (is_obs, ids) in enumerate(segments(out)):
            if is_obs:
                messages.append({"role": "tool", "content": env.answer(k // 2 + 1)})
            else:
                messages.append({"role": "assistant", "content": tok.decode(ids)})
        text = tok.apply_chat_template(messages, tokenize=False)
        rerendered = tok.encode(text, add_special_tokens=False)
        assert rerendered != sequence
        assert tok.decode(rerendered).count("<think>") == 0
