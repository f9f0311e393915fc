"""One speculative round of generate over a decode batch (the rule: speculative.py).

    drafted = draft(...)      # k sparse decode steps per sequence, tokens drawn from q
    logits = runner.verify()  # one dense pass over each sequence's last token and its drafts
    accept_drafts(...)        # per sequence: the drafts that stand and the token after them

Every emitted token is recorded from the dense pass (its log-probs, top-K, logits), at the
dense page count: the rows' policy is the dense engine policy. Pages taken for drafts past the
accepted tokens go back to the pool.
Drafting stops early for a sequence that drew an end token, that has no room left under
max_tokens (a round emits at most k + 1 tokens, the last never a draft), or for which the pool
has no page left (the drafts so far are verified; none is lost).
"""

import time
from dataclasses import dataclass

import torch

from sparrow.rollout.block_manager import BlockManager
from sparrow.rollout.sampler import Distributions, SamplerOutput
from sparrow.rollout.sequence import Sequence
from sparrow.rollout.speculative import accept_drafts, draft_acceptance


@dataclass
class SpeculativeStep:
    """A round's tokens, flat in sequence order (a sequence's tokens one after the other), as
    the engine appends and records them."""

    seqs: list[Sequence]  # the sequence of each token (repeated for its several tokens)
    offsets: list[int]  # each token's place among its sequence's tokens of this round
    tokens: list[int]
    sampled: SamplerOutput  # the tokens' log-probs and top-K under the dense pass
    logits: torch.Tensor  # (N, V) fp32 the dense pass's logits each token is drawn from
    drafted: int  # draft tokens proposed, all sequences
    accepted: int  # of those, kept
    # Per sequence (seqs order of the call), sum_v min(p, q) at the drafts the rule tested
    # (up to and including the first rejected one): the measured speculative acceptance.
    draft_accept: list[torch.Tensor]
    draft_s: float  # seconds drafting (the sparse decode steps)
    verify_s: float  # seconds in the dense pass and the accept/resample step


def speculative_round(
    engine, seqs: list[Sequence], bm: BlockManager, params, tracked: bool
) -> SpeculativeStep:
    """Draft, verify and accept for `seqs` (each with a page for its input token). `engine`:
    the LLMEngine (its runner, sampler, schedule budgets and end tokens). The sequences'
    completion_ids are as before the round: the engine appends the tokens."""
    k = engine.speculative.draft_tokens
    base = [len(s.completion_ids) for s in seqs]
    room = [s.max_tokens - b for s, b in zip(seqs, base, strict=True)]  # >= 1
    ends = set(params.stop_token_ids) | (set() if params.ignore_eos else set(engine.eos_token_ids))
    drafts: list[list[int]] = [[] for _ in seqs]
    draft_probs: list[list[torch.Tensor]] = [[] for _ in seqs]
    active = [i for i in range(len(seqs)) if min(k, room[i] - 1) > 0]
    start_s = time.perf_counter()
    while active:
        step = [seqs[i] for i in active]
        logits = engine.runner.decode(step, engine.budgets(step), tracked)  # (B, V)
        probs = Distributions(logits, params.temperature, params.top_p, params.top_k).probs()
        drawn = engine.sampler.draw_from(probs).tolist()
        still = []
        for row, (i, token) in enumerate(zip(active, drawn, strict=True)):
            seqs[i].completion_ids.append(token)
            drafts[i].append(token)
            draft_probs[i].append(probs[row])
            more = len(drafts[i]) < min(k, room[i] - 1) and token not in ends
            if not _has_page(seqs[i], bm):  # the draft's own slot, for the verify pass
                seqs[i].completion_ids.pop()
                drafts[i].pop()
                draft_probs[i].pop()
                more = False
            if more:
                still.append(i)
        active = still
    drafted_s = time.perf_counter()
    logits = engine.runner.verify(seqs, [len(d) + 1 for d in drafts], tracked)  # (N, V)
    target = Distributions(logits, params.temperature, params.top_p, params.top_k).probs()
    uniforms = engine.sampler.uniforms(sum(len(d) for d in drafts))  # on the logits' device
    flat: list[Sequence] = []
    offsets: list[int] = []
    tokens: list[int] = []
    rows: list[int] = []
    tested: list[torch.Tensor] = []
    start = used = 0
    for seq, drafted, q, b in zip(seqs, drafts, draft_probs, base, strict=True):
        n = len(drafted)
        verdict = accept_drafts(
            torch.stack(q) if q else target[:0],
            target[start : start + n + 1],
            drafted,
            uniforms[used : used + n],
            lambda w: int(engine.sampler.draw_from(w[None])[0]),
        )
        out = drafted[: verdict.num_accepted] + [verdict.next_token]
        m = min(verdict.num_accepted + 1, n)
        q_m, p_m = (torch.stack(q[:m]), target[start : start + m]) if m else (target[:0],) * 2
        tested.append(draft_acceptance(q_m, p_m))  # (m,) on the logits' device
        flat += [seq] * len(out)
        offsets += range(len(out))
        tokens += out
        rows += range(start, start + len(out))
        del seq.completion_ids[b:]
        _release_past(seq, bm, seq.num_tokens + len(out))
        start, used = start + n + 1, used + n
    kept = logits[rows]  # (N, V)
    dense = Distributions(kept, params.temperature, params.top_p, params.top_k)
    sampled = engine.sampler.record(dense, torch.tensor(tokens, device=kept.device))
    drafted_total = sum(len(d) for d in drafts)
    accepted = len(tokens) - len(seqs)
    lengths = [len(t) for t in tested]
    tested = list(torch.cat(tested).cpu().split(lengths))  # one device-to-host copy
    verify_s = time.perf_counter() - drafted_s
    return SpeculativeStep(
        flat,
        offsets,
        tokens,
        sampled,
        kept,
        drafted_total,
        accepted,
        tested,
        drafted_s - start_s,
        verify_s,
    )


def _has_page(seq: Sequence, bm: BlockManager) -> bool:
    """Whether `seq`'s newest token has a cache slot (a page taken for it if needed)."""
    if not bm.needs_page(seq):
        return True
    if bm.num_free_pages == 0:
        return False
    bm.append_page(seq)
    return True


def _release_past(seq: Sequence, bm: BlockManager, num_tokens: int) -> None:
    """Give back the pages past those `num_tokens` tokens need (drafts that were rejected).
    The page for the newest token stays, so the next decode plan update sees the row shorter
    than it wrote it and rewrites it (DecodePlan.update) before any page is appended again."""
    keep = bm.pages_for_tokens(num_tokens)
    if len(seq.page_table) > keep:
        bm.release_pages(seq, keep)
