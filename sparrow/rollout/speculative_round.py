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
from sparrow.rollout.speculative import accept_rounds, draft_acceptance


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
    step_probs: list[torch.Tensor] = []  # (B_step, V) q of each draft step's rows
    draft_rows: list[list[int]] = [[] for _ in seqs]  # each draft's row among them all
    num_rows = 0
    active = [i for i in range(len(seqs)) if min(k, room[i] - 1) > 0]
    start_s = time.perf_counter()
    while active:
        step = [seqs[i] for i in active]
        logits = engine.runner.decode(step, engine.budgets(step), tracked)  # (B, V)
        probs = Distributions(logits, params.temperature, params.top_p, params.top_k).probs()
        drawn = engine.sampler.draw_from(probs).tolist()
        step_probs.append(probs)
        still = []
        for row, (i, token) in enumerate(zip(active, drawn, strict=True)):
            seqs[i].completion_ids.append(token)
            if not _has_page(seqs[i], bm):  # the draft's own slot, for the verify pass
                seqs[i].completion_ids.pop()
                continue
            drafts[i].append(token)
            draft_rows[i].append(num_rows + row)
            if len(drafts[i]) < min(k, room[i] - 1) and token not in ends:
                still.append(i)
        num_rows += len(active)
        active = still
    drafted_s = time.perf_counter()
    logits = engine.runner.verify(seqs, [len(d) + 1 for d in drafts], tracked)  # (N, V)
    target = Distributions(logits, params.temperature, params.top_p, params.top_k).probs()
    device = target.device
    order = [r for rows in draft_rows for r in rows]  # drafts in sequence order
    q = torch.cat(step_probs)[torch.tensor(order, device=device)] if order else target[:0]
    uniforms = engine.sampler.uniforms(len(order))  # on the logits' device
    verdicts = accept_rounds(q, target, drafts, uniforms, engine.sampler.draw_from)
    flat: list[Sequence] = []
    offsets: list[int] = []
    tokens: list[int] = []
    rows: list[int] = []
    tested_q: list[int] = []  # rows of q and target the rule tested: drafts up to the first
    tested_p: list[int] = []  # rejection, as the monitor's speculative acceptance reads them
    lengths: list[int] = []
    start = used = 0
    for seq, drafted, verdict, b in zip(seqs, drafts, verdicts, base, strict=True):
        n = len(drafted)
        out = drafted[: verdict.num_accepted] + [verdict.next_token]
        m = min(verdict.num_accepted + 1, n)
        tested_q += range(used, used + m)
        tested_p += range(start, start + m)
        lengths.append(m)
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
    drafted_total = len(order)
    accepted = len(tokens) - len(seqs)
    index = torch.tensor([tested_q, tested_p], dtype=torch.int64, device=device)  # (2, sum m)
    overlap = draft_acceptance(q[index[0]], target[index[1]])  # (sum m,)
    tested = list(overlap.cpu().split(lengths))  # one device-to-host copy
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
