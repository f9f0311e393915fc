"""Multi-turn episodes on the rollout engine: token in, token out, one Sequence per episode.

    outs = run_episodes(engine, prompts, envs, observe, params, EpisodeLimits(max_turns=4), n=8)

An episode is one sequence for its whole life: the policy samples an assistant turn; when the turn
ends (EOS or a stop token/string) its text goes to the episode's environment (tasks/environment.py),
whose observation (tool results) is tokenized by `observe` (the chat template's delta after the
turn's closing token, ending with the next assistant header) and appended to the same sequence.
That chunk is computed onto the sequence's cached K/V at its true positions (`ModelRunner.extend`:
no re-prefill of the history, no re-rendering of earlier turns by a template), the next turn's
first token is sampled from its last position, and decode goes on under the sparse schedule. The
other episodes keep decoding around it, each at its own turn (continuous batching). What comes out
is exactly the token sequence sampled, observations included, with `observation_mask` marking the
tokens the policy did not sample: their per-token records are 0, and the trainer gives them mask
0 (they never enter the loss, the rollout correction, the acceptance monitor or the mismatch
metrics).

Limits (`EpisodeLimits`): a turn that reaches `params.max_tokens` without closing ends the
episode ("length"); so does the context limit (`max_context_tokens`, the prompt included: an
observation that would not leave room for one more token, or a turn that reaches it), flagged
like an overlong completion. After `max_turns` turns the episode ends as its last turn did (its
reward counted). An observation over `max_observation_tokens` is cut by `observe` (its contents
shortened and marked, the template's frame kept). A sequence whose observation finds no free KV
page is preempted and later recomputed by one dense prefill over all its tokens, as any
preempted sequence.
The episode's reward is the sum of the environment's per-turn rewards.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from sparrow.rollout.outputs import EpisodeInfo, GenerateStats, GenerationOutput, TokenRecords
from sparrow.rollout.scheduler import Scheduler
from sparrow.rollout.sequence import Sequence

# (observation messages, most tokens) -> (token ids: the delta after the turn's closing token,
# ending with the next assistant header; tokens cut from the contents), e.g.
# tasks/environment.py's capped_observation_ids with the tokenizer bound.
Observe = Callable[[list[dict], int], tuple[list[int], int]]


class _StepEnv(Protocol):
    """What the loop needs of an environment (tasks/environment.py's Environment, kept out of
    the rollout package's imports): its observation after an assistant turn's text."""

    def step(self, assistant_text: str, /) -> Any: ...


@dataclass
class EpisodeLimits:
    max_turns: int = 4  # assistant turns per episode
    max_observation_tokens: int = 256  # per observation, cut with TRUNCATION_MARKER
    max_context_tokens: int = 4096  # prompt + every turn and observation

    def __post_init__(self):
        if self.max_turns < 1 or self.max_observation_tokens < 1 or self.max_context_tokens < 2:
            raise ValueError(
                "env.max_turns and env.max_observation_tokens must be >= 1 and the context "
                f"limit >= 2, got {self.max_turns}, {self.max_observation_tokens}, "
                f"{self.max_context_tokens}"
            )


@dataclass
class _Episode:
    env: _StepEnv  # its Environment
    turn_start: int = 0  # completion index where the current turn began
    observed: list[bool] = field(default_factory=list)  # per completion token: an observation
    turns: int = 0
    reward: float = 0.0
    tool_calls: int = 0
    tool_errors: int = 0
    observation_tokens: int = 0
    truncated: int = 0
    chunk_tokens: list[int] = field(default_factory=list)


class _KeptLogits:
    """Raw logits of the sampled tokens, by completion position; observation positions get zero
    rows, so a row's (T, V) lines up with its completion as the monitor reads it."""

    def __init__(self, wanted: list[bool]):
        self.wanted = wanted
        self.rows: list[dict[int, Tensor]] = [{} for _ in wanted]

    def append(self, seq_ids: list[int], positions: list[int], logits: Tensor) -> None:
        for i, (s, t) in enumerate(zip(seq_ids, positions, strict=True)):
            if self.wanted[s]:
                self.rows[s][t] = logits[i].to("cpu", torch.float32)

    def output(self, seq_id: int, num_tokens: int) -> Tensor | None:
        if not self.wanted[seq_id]:
            return None
        rows, self.rows[seq_id] = self.rows[seq_id], {}
        width = next(iter(rows.values())).shape[-1]
        out = torch.zeros(num_tokens, width)  # (T, V)
        for t, row in rows.items():
            out[t] = row
        return out


def run_episodes(
    engine,
    prompts: list[list[int]],
    envs: list,
    observe: Observe,
    params,
    limits: EpisodeLimits,
    n: int = 1,
    schedules: list | None = None,
    logits_rows: list[bool] | None = None,
    seed: int | None = None,
) -> list[GenerationOutput]:
    """n episodes per prompt, ordered prompt-major as `LLMEngine.generate`; `envs` one per
    episode, already reset (prompts[i] is the rendering of episode i*n+j's first messages).
    `params.max_tokens` caps each turn. `schedules`, `logits_rows`, `seed`: as generate's."""
    if engine.speculative is not None:
        raise ValueError("multi-turn episodes do not run with speculative rollouts yet")
    num = len(prompts) * n
    if len(envs) != num:
        raise ValueError(f"got {len(envs)} environments for {num} episodes")
    schedules = engine._per_sequence(schedules, num)
    kept = None
    if params.return_logits:
        kept = _KeptLogits([True] * num if logits_rows is None else list(logits_rows))
    if seed is None:
        seed = engine.seed + engine.num_generate_calls
        engine.num_generate_calls += 1
    engine.sampler.reseed(seed)
    room = [limits.max_context_tokens - len(p) for p in prompts]
    if min(room) < 1:
        raise ValueError(f"a prompt leaves no room under the context limit {limits}")
    seqs = [
        Sequence(i * n + j, i, list(p), room[i], schedule=schedules[i * n + j])
        for i, p in enumerate(prompts)
        for j in range(n)
    ]
    loop = _EpisodeLoop(engine, params, limits, observe, kept)
    loop.episodes = [_Episode(env) for env in envs]
    loop.records = TokenRecords(num, max(room), engine.cfg.topk_logprobs, engine.runner.device)
    loop.tracked = any(s is not None for s in schedules)
    scheduler = engine._new_scheduler()
    for seq in seqs:
        scheduler.add(seq)
    try:
        while not scheduler.is_finished():
            loop.step(scheduler)
    finally:  # a failed call leaves no page held
        scheduler.abort()
    loop.stats.num_preemptions = scheduler.num_preemptions
    engine.last_stats = loop.stats
    return [loop.output(s, n) for s in seqs]


class _EpisodeLoop:
    """The step loop of run_episodes: one engine step, then the turns that ended continue."""

    def __init__(self, engine, params, limits: EpisodeLimits, observe: Observe, kept):
        self.engine, self.params, self.limits, self.observe = engine, params, limits, observe
        self.kept = kept
        self.stats = GenerateStats()
        self.stop_ids = set(params.stop_token_ids)
        self.eos_ids = set() if params.ignore_eos else set(engine.eos_token_ids)
        self.episodes: list[_Episode] = []
        self.records: TokenRecords
        self.tracked = False

    def step(self, scheduler: Scheduler) -> None:
        start = time.perf_counter()
        batch = scheduler.schedule()
        seqs, logits, budgets = self.engine._forward(batch, self.tracked)
        ended = self._append(scheduler, seqs, logits, budgets)
        self.stats.add_step(batch, time.perf_counter() - start, len(seqs))
        while ended:  # a continuation's first token may close its turn at once
            ended = self._continue(scheduler, ended)

    def _append(self, scheduler, seqs: list[Sequence], logits: Tensor, budgets) -> list:
        """Sample one token per sequence, record it, and return the sequences whose turn closed
        with the episode going on; episodes that end are finished."""
        p = self.params
        sampled = self.engine.sampler(logits, p.temperature, p.top_p, p.top_k)
        positions = [len(s.completion_ids) for s in seqs]
        contexts = [s.num_tokens for s in seqs]
        ids = [s.seq_id for s in seqs]
        self.records.write(ids, positions, sampled, budgets, contexts)
        if self.kept is not None:
            self.kept.append(ids, positions, logits)
        closed = []
        for seq, token in zip(seqs, sampled.token_ids.tolist(), strict=True):
            seq.completion_ids.append(token)
            self.episodes[seq.seq_id].observed.append(False)
            reason = self._stop_reason(seq, token)
            if reason == "length":
                self._end(scheduler, seq, reason, abandoned=True)
            elif reason is not None:
                seq.finish_reason = reason  # the turn's; the episode's if it ends here
                closed.append(seq)
        return closed

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        ep = self.episodes[seq.seq_id]
        turn = seq.completion_ids[ep.turn_start :]
        if token in self.stop_ids:
            return "stop"
        if token in self.eos_ids:
            return "eos"
        if self.params.stop_strings:
            window = max(len(s) for s in self.params.stop_strings) + 2
            tail = self.engine.tokenizer.decode(turn[-window:], skip_special_tokens=True)
            if any(s in tail for s in self.params.stop_strings):
                return "stop"
        if len(turn) >= self.params.max_tokens or len(seq.completion_ids) >= seq.max_tokens:
            return "length"
        return None

    def _continue(self, scheduler: Scheduler, closed: list[Sequence]) -> list[Sequence]:
        """Each closed turn's text to its environment; the episodes that go on get their
        observation computed onto their cached K/V and their next turn's first token."""
        tokenizer = self.engine.tokenizer
        going: list[tuple[Sequence, int]] = []
        for seq in closed:
            ep = self.episodes[seq.seq_id]
            ep.turns += 1
            text = tokenizer.decode(seq.completion_ids[ep.turn_start :], skip_special_tokens=True)
            obs = ep.env.step(text)
            ep.reward += float(obs.reward)
            ep.tool_calls += int(obs.tool_calls)
            ep.tool_errors += int(obs.tool_errors)
            if obs.done or ep.turns >= self.limits.max_turns:
                assert seq.finish_reason is not None  # set when its turn closed
                self._end(scheduler, seq, seq.finish_reason, abandoned=not obs.done)
                continue
            ids, cut = self.observe(obs.messages, self.limits.max_observation_tokens)
            ep.truncated += cut > 0
            if seq.num_tokens + len(ids) >= self.limits.max_context_tokens:
                self._end(scheduler, seq, "length", abandoned=True)  # no room: overlong
                continue
            seq.completion_ids.extend(ids)
            ep.observed.extend([True] * len(ids))
            ep.observation_tokens += len(ids)
            ep.turn_start = len(seq.completion_ids)
            seq.finish_reason = None
            if not _take_pages(scheduler, seq):
                scheduler.preempt(seq)  # recomputed by a prefill, its next token sampled there
                continue
            going.append((seq, len(ids) + 1))  # + the closing token no decode step cached
        if not going:
            return []
        start = time.perf_counter()
        seqs = [s for s, _ in going]
        chunks = [c for _, c in going]
        logits = self.engine.runner.extend(seqs, chunks, self.tracked)  # (B, V)
        for seq, chunk in going:
            self.episodes[seq.seq_id].chunk_tokens.append(chunk)
        pages = [self.engine._pages(s.num_tokens) for s in seqs]  # a chunk attends densely
        closed = self._append(scheduler, seqs, logits, pages)
        self.stats.prefill_s += time.perf_counter() - start
        self.stats.prefill_tokens += sum(chunks)
        return closed

    def _end(self, scheduler: Scheduler, seq: Sequence, reason: str, abandoned: bool) -> None:
        """Finish the episode; an environment that did not say done is closed (an isolated one
        frees its state in the worker)."""
        scheduler.finish(seq, reason)
        close = getattr(self.episodes[seq.seq_id].env, "close", None)
        if abandoned and close is not None:
            close()

    def output(self, seq: Sequence, n: int) -> GenerationOutput:
        ep = self.episodes[seq.seq_id]
        num = len(seq.completion_ids)
        kept = None if self.kept is None else self.kept.output(seq.seq_id, num)
        out = self.records.output(
            seq.seq_id,
            num,
            prompt_index=seq.group_id,
            sample_index=seq.seq_id % n,
            prompt_ids=seq.prompt_ids,
            token_ids=seq.completion_ids,
            text=self.engine.tokenizer.decode(seq.completion_ids, skip_special_tokens=True),
            finish_reason=seq.finish_reason,
            num_preemptions=seq.num_preemptions,
            logits=kept,
        )
        out.observation_mask = torch.tensor(ep.observed, dtype=torch.bool)
        out.episode = EpisodeInfo(
            turns=ep.turns,
            reward=ep.reward,
            tool_calls=ep.tool_calls,
            tool_errors=ep.tool_errors,
            observation_tokens=ep.observation_tokens,
            truncated_observations=ep.truncated,
            chunk_tokens=list(ep.chunk_tokens),
        )
        return out


def _take_pages(scheduler: Scheduler, seq: Sequence) -> bool:
    """Pages for every token of `seq` (the chunk writes the K/V of all of them); False,
    holding what it took, when the pool runs out."""
    bm = scheduler.block_manager
    while len(seq.page_table) < bm.pages_for_tokens(seq.num_tokens):
        if bm.num_free_pages == 0:
            return False
        bm.append_page(seq)
    return True
