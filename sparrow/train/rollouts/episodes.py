"""The trainer's multi-turn episodes (env.function set): environments per prompt row, the engine's
episode loop (rollout/episodes.py), the episodes' rewards and what the step logs of them.

    episodes = Episodes(cfg.env, tokenizer, engine, max_new_tokens)
    outputs = episodes.generate(prompts, params, n=8, schedules=..., seed=...)
    scores = episodes.scores(outputs)           # BatchScores: each episode's summed reward
    metrics = episode_metrics(outputs, ranks)   # episode/turns_mean, tool calls, tokens, ...

Each episode gets its own guarded environment (tasks/env_guard.py: a raising, hanging or
oversized tool is an error observation or a 0 reward, counted, never a crash), built from its
prompt row; its first messages and tools are rendered once (`first_prompt_ids`), and every
sample of a row must render the same prompt (a GRPO group shares it). The environments run where
the rollout runs: in the trainer's process, its rollout thread (rl.async.staleness=1) or on a
rollout rank (cluster.rollout_ranks), whichever draws.
"""

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sparrow.distributed import Ranks
from sparrow.rollout.episodes import EpisodeLimits, run_episodes
from sparrow.tasks.env_guard import GuardedEnvFactory
from sparrow.tasks.environment import capped_observation_ids, first_prompt_ids
from sparrow.tasks.rewards import BatchScores, RewardStats
from sparrow.train.config import EnvConfig


@dataclass
class EpisodeRewardStats(RewardStats):
    """The episodes' reward counts plus what their environments' guard counted while they ran
    (env/errors, env/timeouts, env/non_text, env/cut, env/steps, env/episodes): the step's
    metrics sum them over ranks, wherever the environments ran."""

    env: dict[str, float] = field(default_factory=dict)

    def add(self, other: RewardStats) -> None:
        super().add(other)
        for key, value in getattr(other, "env", {}).items():
            self.env[key] = self.env.get(key, 0.0) + value

    def as_metrics(self) -> dict[str, float]:
        return super().as_metrics() | self.env


class Episodes:
    def __init__(self, cfg: EnvConfig, tokenizer, engine, max_new_tokens: int):
        """`max_new_tokens`: each assistant turn's cap (rollout.max_new_tokens, or the
        evaluation's), which the default context limit counts once per turn."""
        assert cfg.function, "multi-turn episodes need env.function"
        self.cfg, self.tokenizer, self.engine = cfg, tokenizer, engine
        self.max_new_tokens = max_new_tokens
        self.factory = GuardedEnvFactory(
            spec=cfg.function,
            timeout_s=cfg.timeout_s,
            max_observation_chars=cfg.max_observation_chars,
            isolate=cfg.isolate,
        )
        self._counted: dict[int, dict[str, float]] = {}  # per thread: its last call's env/*

    def generate(self, prompts: Sequence, params, n: int = 1, **engine_kwargs) -> list:
        """n episodes per prompt row (tasks/data.py Prompt), prompt-major as the engine's
        `generate`; `engine_kwargs`: its schedules, logits_rows and seed."""
        before = self.factory.stats.as_metrics()
        envs = [self.factory(p.row) for p in prompts for _ in range(n)]
        first = [first_prompt_ids(self.tokenizer, env.reset(), env.tools) for env in envs]
        prompt_ids = first[::n]
        for i, ids in enumerate(first):
            if ids != prompt_ids[i // n]:
                raise ValueError(
                    f"env.function={self.cfg.function}: reset() gave the samples of prompt row "
                    f"{prompts[i // n].index} different first messages; a GRPO group shares "
                    "its prompt, so reset() must depend on the row alone"
                )
        limits = EpisodeLimits(
            self.cfg.max_turns, self.cfg.max_observation_tokens, self.context_tokens(prompt_ids)
        )

        def observe(messages: list[dict], max_tokens: int) -> tuple[list[int], int]:
            return capped_observation_ids(self.tokenizer, messages, max_tokens)

        outputs = run_episodes(
            self.engine, prompt_ids, envs, observe, params, limits, n=n, **engine_kwargs
        )
        after = self.factory.stats.as_metrics()
        self._counted[threading.get_ident()] = {k: after[k] - before[k] for k in after}
        return outputs

    def context_tokens(self, prompt_ids: list[list[int]]) -> int:
        """The episodes' context limit: env.max_context_tokens (or its default from the longest
        prompt), at most the KV pool and the model's positions."""
        limit = self.cfg.context_tokens(max(map(len, prompt_ids)), self.max_new_tokens)
        ecfg = self.engine.cfg
        positions = getattr(self.engine.model_config, "max_position_embeddings", None) or limit
        return min(limit, ecfg.num_pages * ecfg.page_size, positions)

    def scores(self, outputs: Sequence) -> BatchScores:
        """Each episode's reward (the sum of its turns'), as the reward's BatchScores; its
        stats carry the guard's env/* counts of this thread's last `generate` (these outputs')."""
        scores = torch.tensor([o.episode.reward for o in outputs], dtype=torch.float32)  # (N,)
        env = self._counted.pop(threading.get_ident(), {})
        stats = EpisodeRewardStats(calls=len(outputs), env=env)
        return BatchScores(scores, [{} for _ in outputs], stats)

    def close(self) -> None:
        self.factory.close()


def episode_metrics(outputs: Sequence, ranks: Ranks) -> dict:
    """Per episode over all ranks: turns, tool calls and errors, observation and model tokens,
    observations cut, and the share of episodes that ended at the context or turn limit; {}
    for single-turn outputs."""
    episodes = [o.episode for o in outputs if getattr(o, "episode", None) is not None]
    if not episodes:
        return {}
    n = len(outputs)
    model = sum(int((~o.observation_mask).sum()) for o in outputs)
    sums = {
        "episode/turns_mean": sum(e.turns for e in episodes),
        "episode/tool_calls_mean": sum(e.tool_calls for e in episodes),
        "episode/tool_errors_mean": sum(e.tool_errors for e in episodes),
        "episode/observation_tokens_mean": sum(e.observation_tokens for e in episodes),
        "episode/model_tokens_mean": model,
        "episode/truncated_observations_mean": sum(e.truncated_observations for e in episodes),
    }
    metrics = {k: ranks.mean(float(v), n) for k, v in sums.items()}
    metrics["episode/tool_calls"] = ranks.sum(float(sums["episode/tool_calls_mean"]))
    metrics["episode/tool_errors"] = ranks.sum(float(sums["episode/tool_errors_mean"]))
    return metrics
