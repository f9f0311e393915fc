"""The rollout engine: the step loop that turns prompts into sampled completions with log-probs.

    engine = LLMEngine(model, tokenizer, EngineConfig(num_pages=512), schedule=lambda ctx: 32)
    outs = engine.generate(prompt_ids, SamplingParams(temperature=1.0, max_tokens=256), n=8)

Each step the scheduler picks a prefill or a decode batch, the model runner computes logits, the
sampler draws one token per sequence, and finished sequences (EOS, a stop token or string, max
tokens) release their pages. When a call's prompts all start with the same whole KV pages (a
few-shot prefix; `share_prefix`), generate computes those once, holds them for the call, and
prefills each prompt only from there, against the cached prefix K/V: the same tokens and
log-probs as full prefills up to fp32 rounding (seeded sampling: when the steps hold the same
sequences; prefill steps fit more prompts when only their tails count). Decode attention is
block-sparse with a per-sequence budget from `schedule(context_tokens) -> pages` (None, or a
None budget: dense). `score` teacher-forces given
completions through the same paths, to compare the engine's policy with another one.
`set_lora` adds an unmerged low-rank delta that acts only on sparsely decoded tokens (budget <
pages), in generate and score alike: DistillSparse's gated adapter.

A preempted sequence is rebuilt by a dense prefill over its prompt + generated tokens, so its
later tokens attend to densely computed K/V of its earlier ones; the recorded log-probs are
always those of the distribution each token was actually drawn from. So are the raw logits kept
with `SamplingParams.return_logits`: what `score` returns for the row under the same schedule,
except after a preemption of a sparsely decoded row (there `score`'s replay is the approximation).
"""

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor
from tqdm.auto import tqdm

from sparrow.models.families import check_family, check_window
from sparrow.rollout.block_manager import BlockManager
from sparrow.rollout.linear import Linear
from sparrow.rollout.lora import from_wire
from sparrow.rollout.model_runner import ModelRunner
from sparrow.rollout.outputs import GenerateStats, GenerationOutput, LogitsStore, TokenRecords
from sparrow.rollout.paged_attention import SparseAttentionConfig
from sparrow.rollout.sampler import Sampler, SamplerOutput
from sparrow.rollout.scheduler import DecodeBatch, PrefillBatch, Scheduler
from sparrow.rollout.sequence import Sequence
from sparrow.rollout.sleep import check_level
from sparrow.rollout.speculative import SpeculativeConfig
from sparrow.rollout.speculative_round import speculative_round

Schedule = Callable[[int], int | None]  # context length in tokens -> budget in pages (None: dense)


@dataclass
class EngineConfig:
    page_size: int = 16  # tokens per KV page
    num_pages: int = 1024  # KV pool size in pages (shared by all sequences), allocated once
    max_batch_size: int = 64  # most sequences running at once
    max_prefill_tokens: int = 8192  # most prompt tokens per prefill step (one group may exceed)
    dense_layers: tuple[int, ...] = (0, 1)  # layers that always decode densely
    score: str = "quest"  # page score of sparse layers: "quest" | "centroid"
    num_sink: int = 1  # first pages always attended (attention sink)
    num_recent: int = 2  # last pages always attended (recent window)
    topk_logprobs: int = 20  # K of the recorded top-K log-probs
    backend: str = "auto"  # kernel backend: "auto" | "torch" | "triton" | "cpp"
    dense_kv_copy: bool = True  # torch backend: dense layers keep contiguous K/V (dense_kv.py)
    # CPU C++ kernel: the dense layers of rows that share pages (samples of one prompt) read each
    # shared page once through it; False: per-row contiguous copies, as for rows that share
    # nothing (`sparrow-bench dense-shared` compares the two).
    shared_page_kernel: bool = True
    dtype: str = "float32"  # weights, activations and KV cache: float32 | bfloat16 | float16
    linear_backend: str = "torch"  # GEMMs: "torch" (as HF) | "onednn" (CPU fp32, packed, faster)
    # Sampler seed; each generate call reseeds with seed + call index. None: the trainer derives
    # it from the run's `seed` (sparrow/train/run/seeds.py); a standalone engine takes 0.
    seed: int | None = None
    # Replay decode steps from CUDA graphs captured per step shape (batch, pages and budget padded
    # to buckets); CUDA with the Triton backend only. Eager when an unmerged LoRA gates rows.
    cuda_graphs: bool = False
    # generate: compute the whole KV pages that all of a call's (two or more distinct) prompts
    # start with once, and prefill each prompt only from there (few-shot prompts share ~90%).
    share_prefix: bool = True
    # Between a rollout and the next, what the trainer frees for the actor's phases (sleep.py):
    # off | kv (pool, page summaries, graphs) | weights (and the weight copy, pushed again on
    # wake). The memory fit turns on kv when its plan needs it.
    sleep: str = "off"

    def __post_init__(self):
        check_level(self.sleep)
        if self.max_batch_size < 1 or self.max_prefill_tokens < 1:
            raise ValueError(
                "rollout.engine.max_batch_size and max_prefill_tokens must be >= 1, got "
                f"{self.max_batch_size} and {self.max_prefill_tokens}"
            )


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept; 1.0 keeps the full vocabulary
    top_k: int | None = None  # keep the k most likely tokens; None keeps all
    max_tokens: int = 256  # completion length cap ("length")
    stop_token_ids: tuple[int, ...] = ()  # tokens that end a completion ("stop"), kept in it
    stop_strings: tuple[str, ...] = ()  # strings whose appearance ends a completion ("stop")
    ignore_eos: bool = False  # keep going past EOS (fixed-length benchmarks)
    # Keep each token's raw logits (T, V) on its output: the exact-acceptance monitor reads them
    # instead of replaying the completions through the engine (costs T x V fp32 per sequence).
    return_logits: bool = False


class LLMEngine:
    def __init__(
        self,
        model,
        tokenizer,
        cfg: EngineConfig,
        schedule: Schedule | None = None,
        speculative: SpeculativeConfig | None = None,
    ):
        """`speculative` (enabled): decode steps draft with the sparse schedule and verify
        densely (speculative.py), so that every sampled token is the dense policy's."""
        self.cfg = cfg
        self.speculative = speculative if speculative is not None and speculative.enabled else None
        self.model_config = model.config
        # A sliding window (Mistral) shorter than the pool and the positions is refused here, as
        # the CLIs hold sequences to both; a call's longer sequence, in the call (_check_window).
        positions = getattr(model.config, "max_position_embeddings", None)
        pool_tokens = cfg.num_pages * cfg.page_size
        check_family(
            model.config,
            context_tokens=min(pool_tokens, positions or pool_tokens),
            context_from="rollout.engine.num_pages x page_size, at most max_position_embeddings",
        )
        self.tokenizer = tokenizer
        attn = SparseAttentionConfig(
            page_size=cfg.page_size,
            dense_layers=tuple(cfg.dense_layers),
            score=cfg.score,
            num_sink=cfg.num_sink,
            num_recent=cfg.num_recent,
            backend=cfg.backend,
            dense_kv_copy=cfg.dense_kv_copy,
            shared_page_kernel=cfg.shared_page_kernel,
        )
        linear = Linear(cfg.linear_backend, batch_hint=min(cfg.max_batch_size, 64))
        self.runner = ModelRunner(
            model,
            attn,
            cfg.num_pages,
            getattr(torch, cfg.dtype),
            linear,
            cuda_graphs=cfg.cuda_graphs,
            max_batch_size=cfg.max_batch_size,
        )
        self.seed = 0 if cfg.seed is None else cfg.seed
        self.sampler = Sampler(cfg.topk_logprobs, self.seed, self.runner.device)
        self.schedule = schedule
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self.num_generate_calls = 0
        self.last_stats = GenerateStats()  # of the latest generate call (zeros before one)

    @property
    def sparse_settings(self):
        """The sparse attention's settings the engine runs with (page size, dense layers, page
        scoring): what DistillSparse's training-time selection and the benches must match."""
        return self.runner.sparse_settings

    def set_schedule(self, schedule: Schedule | None) -> None:
        self.schedule = schedule

    def set_draft_tokens(self, k: int) -> None:
        """Speculative rounds draft `k` tokens from now on (the throughput controller's k)."""
        assert self.speculative is not None, "draft tokens set on an engine that does not draft"
        self.speculative = replace(self.speculative, draft_tokens=k)

    def update_weights(self, state_dict: dict[str, Tensor]) -> None:
        """Copy HF-named weights (any subset; e.g. base + merged LoRA) in place; cache untouched.
        A LoRA set with `set_lora` is kept. After sleep("weights"): every weight."""
        self.runner.load_weights([state_dict])

    def update_weights_in_buckets(self, buckets: Iterable[Mapping[str, Tensor]]) -> None:
        """`update_weights` one bucket at a time (a weight push, rollout/weight_push.py), the
        linear backend repacked once after the last."""
        self.runner.load_weights(buckets)

    def sleep(self, level: str) -> None:
        """Free the KV cache and decode graphs ("kv"), and the weight copy too ("weights"), until
        `wake` or the next generate/score (sleep.py); "off" does nothing."""
        if check_level(level) != "off":
            self.runner.sleep(weights=level == "weights")

    def wake(self) -> None:
        """Re-allocate what `sleep` freed; a freed weight copy waits for `update_weights`."""
        self.runner.wake()

    @property
    def asleep(self) -> bool:
        return self.runner.asleep

    def set_policy_lora(self, factors: dict[str, tuple[Tensor, Tensor]] | None) -> int:
        """The policy's LoRA adapter (LoRA RL, actor.lora), unmerged, applied at every forward:
        prefill, dense and sparse decode, score and speculative verify; a gated `set_lora`
        adapter adds on top at sparse decode steps. factors: as `set_lora`'s; copied in place
        into the previous adapter's tensors when their shapes match, so captured CUDA graphs
        stay valid; otherwise the graphs are dropped and captured again. None removes it.
        Returns the bytes the adapter takes in the engine's dtype (what a sync moved)."""
        if self.runner.model.set_policy_lora(factors) and self.runner.graphs is not None:
            self.runner.graphs = type(self.runner.graphs)(self.runner.graphs.forward)
        itemsize = self.runner.model.dtype.itemsize
        return sum(a.numel() + b.numel() for a, b in (factors or {}).values()) * itemsize

    def update_policy_lora_in_buckets(self, buckets: Iterable[Mapping[str, Tensor]]) -> None:
        """`set_policy_lora` from a weight push's buckets of `<module>.lora_A` / `.lora_B`
        tensors (sparrow.rollout.lora.wire_tensors), set once the last has arrived."""
        tensors: dict[str, Tensor] = {}
        for bucket in buckets:
            tensors |= {name: t.clone() for name, t in bucket.items()}
        self.set_policy_lora(from_wire(tensors))

    def set_lora(self, factors: dict[str, tuple[Tensor, Tensor]] | None) -> None:
        """An unmerged LoRA applied only at sparse decode steps (budget < pages; every layer of
        the row, the K/V it writes included); prefill and dense rows use the plain weights.
        factors: HF module name (`model.layers.3.self_attn.q_proj`) -> (A (r, in), B (out, r)
        pre-multiplied by the LoRA scaling), copied; None removes the adapter."""
        self.runner.model.set_lora(factors)

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        n: int = 1,
        progress: bool = False,
        schedules: list[Schedule | None] | None = None,
        logits_rows: list[bool] | None = None,
        seed: int | None = None,
    ) -> list[GenerationOutput]:
        """n samples per prompt, ordered prompt-major (prompt 0's samples 0..n-1, then prompt 1).

        `schedules`, one per output sequence, overrides the engine's schedule for that sequence
        (None: dense), e.g. to roll out a noise-floor share densely, or several budgets from one
        shared prefill. With `params.return_logits`, `logits_rows` (one per output sequence;
        None: all) says which outputs carry their logits, to hold only those a caller reads.
        `seed` samples this call from a stream of the caller's (e.g. evaluation's) instead of
        the engine's own (seed + call index), which then does not advance.
        """
        _check_prompts(prompts, n, params)
        self.runner.ensure_awake()
        _check_window(self.model_config, prompts, [params.max_tokens] * len(prompts), "max_tokens")
        schedules = self._per_sequence(schedules, len(prompts) * n)
        kept = _logits_store(params, logits_rows, len(prompts) * n)
        if seed is None:
            seed = self.seed + self.num_generate_calls
            self.num_generate_calls += 1
        self.sampler.reseed(seed)
        seqs = [
            Sequence(i * n + j, i, list(p), params.max_tokens, schedule=schedules[i * n + j])
            for i, p in enumerate(prompts)
            for j in range(n)
        ]
        scheduler = self._new_scheduler()
        tracked = any(s is not None for s in schedules)  # page summaries serve sparse decode only
        bar = tqdm(total=len(seqs), desc="generate", unit="seq", disable=not progress)
        stats = GenerateStats()
        for seq in seqs:
            scheduler.add(seq)
        try:
            self._prefill_prefix(scheduler.block_manager, prompts, tracked, stats)
            records = TokenRecords(
                len(seqs), params.max_tokens, self.cfg.topk_logprobs, self.runner.device
            )
            while not scheduler.is_finished():
                self._step(scheduler, params, records, kept, tracked, stats, bar)
        finally:  # a failed call leaves no page held
            scheduler.abort()
            scheduler.block_manager.release_prefix()
            bar.close()
        stats.num_preemptions = scheduler.num_preemptions
        self.last_stats = stats
        return [self._output(s, n, records, kept) for s in seqs]

    def _step(
        self,
        scheduler: Scheduler,
        params: SamplingParams,
        records: TokenRecords,
        kept: LogitsStore | None,
        tracked: bool,
        stats: GenerateStats,
        bar,
    ) -> None:
        """One scheduled prefill or decode step of generate (in speculative mode a decode step
        is a draft-and-verify round, one or more tokens per sequence), its tokens recorded and
        appended, finished sequences released."""
        start = time.perf_counter()
        batch = scheduler.schedule()
        if self.speculative is not None and isinstance(batch, DecodeBatch):
            spec = speculative_round(self, batch.seqs, scheduler.block_manager, params, tracked)
            stats.add_round(batch.seqs, spec)
            step_seqs, tokens, sampled, logits = spec.seqs, spec.tokens, spec.sampled, spec.logits
            budgets = [
                self._pages(s.num_tokens + o) for s, o in zip(step_seqs, spec.offsets, strict=True)
            ]
        else:
            step_seqs, logits, budgets = self._forward(batch, tracked)
            sampled = self.sampler(logits, params.temperature, params.top_p, params.top_k)
            tokens = sampled.token_ids.tolist()
        stop_ids = set(params.stop_token_ids)
        eos_ids = set() if params.ignore_eos else set(self.eos_token_ids)
        rows, positions, contexts, ended = [], [], [], set()
        for i, (seq, token) in enumerate(zip(step_seqs, tokens, strict=True)):
            if id(seq) in ended:  # a round's tokens past the one that ended its sequence
                continue
            rows.append(i)
            positions.append(len(seq.completion_ids))
            contexts.append(seq.num_tokens)
            seq.completion_ids.append(token)
            reason = self._stop_reason(seq, token, params, stop_ids, eos_ids)
            if reason is not None:
                scheduler.finish(seq, reason)
                ended.add(id(seq))
                bar.update(1)
        if len(rows) < len(tokens):
            sampled, logits = _rows(sampled, rows), logits[rows]
            budgets = [budgets[i] for i in rows]
        seq_ids = [step_seqs[i].seq_id for i in rows]
        records.write(seq_ids, positions, sampled, budgets, contexts)
        if kept is not None:
            kept.append(seq_ids, positions, logits)
        stats.add_step(batch, time.perf_counter() - start, len(rows))
        bar.set_postfix(decode_tok_s=f"{stats.decode_tok_s:.1f}", refresh=False)

    def _prefill_prefix(
        self, bm: BlockManager, prompts: list[list[int]], tracked: bool, stats: GenerateStats
    ) -> None:
        """Hold and prefill the pages of the prompts' shared prefix (`shared_prefix_tokens`),
        if any and `share_prefix`; the scheduler's prefills then start after it."""
        if not self.cfg.share_prefix:
            return
        num_tokens = shared_prefix_tokens(prompts, self.cfg.page_size)
        if num_tokens == 0:
            return
        start = time.perf_counter()
        prefix = Sequence(len(prompts), len(prompts), prompts[0][:num_tokens], max_tokens=1)
        prefix.page_table = bm.hold_prefix(prefix.prompt_ids)
        self.runner.prefill([[prefix]], tracked)  # its logits predict nothing anyone samples
        stats.prefill_s += time.perf_counter() - start
        stats.prefill_tokens += num_tokens

    def score(
        self,
        prompts: list[list[int]],
        completions: list[list[int]],
        schedules: list[Schedule | None] | None = None,
    ) -> list[Tensor]:
        """Teacher-force `completions`: logits (T_i, V) fp32 predicting completions[i][t] from
        prompt + completions[i][:t], under the current schedule or `schedules[i]` (prefill dense,
        decode sparse; None: dense). Identical prompts are prefilled once and share their full
        pages, as in generate, so dense and sparse replays of one prompt cost one prefill; every
        sequence is held in the cache at once (no preemption)."""
        _check_window(self.model_config, prompts, [len(c) for c in completions], "completion")
        self.runner.ensure_awake()
        schedules = self._per_sequence(schedules, len(prompts))
        bm = BlockManager(self.cfg.num_pages, self.cfg.page_size)
        seqs = [
            Sequence(i, i, list(p), max(len(c), 1), schedule=schedules[i])
            for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
        ]
        groups: dict[tuple[int, ...], list[Sequence]] = {}
        for seq in seqs:
            groups.setdefault(tuple(seq.prompt_ids), []).append(seq)
        need = 0
        for prompt, group in groups.items():
            shared = len(prompt) // self.cfg.page_size
            lengths = [len(prompt) + len(completions[s.seq_id]) for s in group]
            need += shared + sum(bm.pages_for_tokens(n) - shared for n in lengths)
        if need > bm.num_pages:
            raise ValueError(f"score needs {need} KV pages at once, the pool has {bm.num_pages}")
        for group in groups.values():
            bm.allocate_prefill(group)
        tracked = any(s is not None for s in schedules)
        first = self.runner.prefill(list(groups.values()), tracked)  # (G, V)
        logits: list[list[Tensor]] = [[] for _ in seqs]
        for row, group in zip(first, groups.values(), strict=True):
            for seq in group:
                logits[seq.seq_id].append(row)
        for t in range(max(len(c) for c in completions) - 1):
            step = [s for s, c in zip(seqs, completions, strict=True) if t + 1 < len(c)]
            for seq in step:
                seq.completion_ids.append(completions[seq.seq_id][t])
                if bm.needs_page(seq):
                    bm.append_page(seq)
            rows = self.runner.decode(step, self.budgets(step), tracked)  # (B, V)
            if self.runner.graphs is not None:  # the graph's buffer: the next step overwrites it
                rows = rows.clone()  # eager (CPU) logits are the step's own: no copy
            for seq, row in zip(step, rows, strict=True):
                logits[seq.seq_id].append(row)
        return [torch.stack(rows)[: len(c)] for rows, c in zip(logits, completions, strict=True)]

    def _forward(
        self, batch: PrefillBatch | DecodeBatch, tracked: bool
    ) -> tuple[list[Sequence], Tensor, list[int]]:
        """Logits (B, V) for the batch's sequences, and the pages each one's token reads."""
        if isinstance(batch, PrefillBatch):
            seqs = [s for g in batch.groups for s in g]
            rows = torch.tensor([i for i, g in enumerate(batch.groups) for _ in g])
            logits = self.runner.prefill(batch.groups, tracked)[rows.to(self.runner.device)]
            return seqs, logits, [self._pages(s.num_tokens) for s in seqs]  # prefill is dense
        seqs = batch.seqs
        budgets = self.budgets(seqs)
        logits = self.runner.decode(seqs, budgets, tracked)
        pages = [self._pages(s.num_tokens) for s in seqs]
        if budgets is None:
            return seqs, logits, pages
        return seqs, logits, [min(b, p) for b, p in zip(budgets, pages, strict=True)]

    def _new_scheduler(self) -> Scheduler:
        bm = BlockManager(self.cfg.num_pages, self.cfg.page_size)
        return Scheduler(bm, self.cfg.max_batch_size, self.cfg.max_prefill_tokens)

    def _pages(self, num_tokens: int) -> int:
        return -(-num_tokens // self.cfg.page_size)

    def _per_sequence(self, schedules: list | None, num_seqs: int) -> list[Schedule | None]:
        if schedules is None:
            return [self.schedule] * num_seqs
        if len(schedules) != num_seqs:
            raise ValueError(f"got {len(schedules)} schedules for {num_seqs} sequences")
        return list(schedules)

    def budgets(self, seqs: list[Sequence]) -> list[int] | None:
        """Per-sequence page budgets for a decode step; None when every sequence is dense."""
        floor = self.cfg.num_sink + self.cfg.num_recent  # the forced pages always fit
        budgets, any_sparse = [], False
        for seq in seqs:
            pages = self._pages(seq.num_tokens)
            budget = None if seq.schedule is None else seq.schedule(seq.num_tokens)
            if budget is None or budget >= pages:
                budgets.append(max(pages, floor))  # all pages: the selection keeps every one
            else:
                budgets.append(max(budget, floor))
                any_sparse = True
        return budgets if any_sparse else None

    def _stop_reason(
        self, seq: Sequence, token: int, params: SamplingParams, stop_ids: set, eos_ids: set
    ) -> str | None:
        if token in stop_ids:
            return "stop"
        if token in eos_ids:
            return "eos"
        if params.stop_strings and self._hits_stop_string(seq, params.stop_strings):
            return "stop"
        if len(seq.completion_ids) >= seq.max_tokens:
            return "length"
        return None

    def _hits_stop_string(self, seq: Sequence, stop_strings: tuple[str, ...]) -> bool:
        # A stop string completed by this token lies within its last few tokens (every token is
        # at least one character, except special ones); earlier ones would have stopped already.
        window = max(len(s) for s in stop_strings) + 2
        tail = self.tokenizer.decode(seq.completion_ids[-window:], skip_special_tokens=True)
        return any(s in tail for s in stop_strings)

    def _output(
        self, seq: Sequence, n: int, records: TokenRecords, kept: LogitsStore | None
    ) -> GenerationOutput:
        return records.output(
            seq.seq_id,
            len(seq.completion_ids),
            prompt_index=seq.group_id,
            sample_index=seq.seq_id % n,
            prompt_ids=seq.prompt_ids,
            token_ids=seq.completion_ids,
            text=self.tokenizer.decode(seq.completion_ids, skip_special_tokens=True),
            finish_reason=seq.finish_reason,
            num_preemptions=seq.num_preemptions,
            logits=None if kept is None else kept.output(seq.seq_id, len(seq.completion_ids)),
        )


def shared_prefix_tokens(prompts: list[list[int]], page_size: int) -> int:
    """Length of the longest prefix all prompts share, in whole pages, that leaves every prompt
    at least one token of its own (its last token's logits come from its own prefill); 0 when
    below one page or when the prompts are all the same (samples of one prompt share already)."""
    first = prompts[0]
    if all(p == first for p in prompts):
        return 0
    common = min(len(p) for p in prompts) - 1
    for p in prompts[1:]:
        common = next((i for i in range(common) if p[i] != first[i]), common)
    return common // page_size * page_size


def _eos_ids(model, tokenizer) -> tuple[int, ...]:
    """EOS ids from the generation config (what HF generate stops on), else the model config,
    plus the tokenizer's."""
    gen = getattr(model, "generation_config", None)
    ids = getattr(gen, "eos_token_id", None) or getattr(model.config, "eos_token_id", None)
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(dict.fromkeys(ids))


def _rows(sampled: SamplerOutput, rows: list[int]) -> SamplerOutput:
    index = torch.tensor(rows, device=sampled.token_ids.device)
    return SamplerOutput(*(getattr(sampled, f.name)[index] for f in fields(SamplerOutput)))


def _logits_store(
    params: SamplingParams, rows: list[bool] | None, num_seqs: int
) -> LogitsStore | None:
    if not params.return_logits:
        return None
    if rows is None:
        return LogitsStore([True] * num_seqs)
    if len(rows) != num_seqs:
        raise ValueError(f"got {len(rows)} logits_rows for {num_seqs} sequences")
    return LogitsStore(list(rows))


def _check_window(
    config, prompts: list[list[int]], completion_tokens: list[int], what: str
) -> None:
    """Refuse a call whose longest sequence, prompt + `what` (max_tokens, or the completion
    scored), a sliding window would cut (families.check_window)."""
    rows = list(zip(map(len, prompts), completion_tokens, strict=True))  # (prompt, completion)
    if not rows:
        return
    i = max(range(len(rows)), key=lambda i: sum(rows[i]))
    p, c = rows[i]
    context = f"the {p + c} tokens of prompt {i} ({p}) + its {what} ({c})"
    check_window(config, p + c, context, fits=f"a prompt + {what} of")


def _check_prompts(prompts: list[list[int]], n: int, params: SamplingParams) -> None:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("generate needs at least one prompt, and no empty prompt")
    if n < 1 or params.max_tokens < 1:
        raise ValueError(
            f"need n >= 1 and max_tokens >= 1, got n={n}, max_tokens={params.max_tokens}"
        )
    if any(not s for s in params.stop_strings):
        raise ValueError("stop_strings must not contain an empty string")
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
