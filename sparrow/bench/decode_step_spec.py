"""The speculative arm of `sparrow-bench decode-step` (`--speculative-k K`): beside the sparse and
the dense decode step, one dense verify pass of K + 1 positions per sequence (the round's input
token and K drafts, `ModelRunner.verify` as a speculative round runs it), timed at the same shape.

    sparrow-bench decode-step --speculative-k 4 --json runs/decode_step.json  # the GPU check

A speculative round is K sparse steps and one verify: at acceptance a it emits
E(a, K) = (1 - a^(K+1)) / (1 - a) tokens per sequence, so its speedup over dense decode is
E(a, K) x dense_ms / (K x sparse_ms + verify_ms), reported per configuration at the acceptances
docs/gpu/speculative_prediction.md predicts for (random weights have no meaningful acceptance of
their own: the step times are what this arm measures). Drafts are random tokens appended for the
pass and taken back after it, so the context is as the other arms leave it; the pass is eager
(verify is not captured in a CUDA graph).
"""

import torch

from sparrow.bench.step_timer import StepTimer, summary
from sparrow.control.cost_model import expected_tokens_per_round
from sparrow.control.speculative_prediction import GRID, calibrated_acceptance
from sparrow.rollout.block_manager import BlockManager
from sparrow.rollout.sequence import Sequence


def acceptances() -> list[float]:
    """The acceptances the prediction is written at: the calibration's and the grid."""
    return sorted({*calibrated_acceptance()[1], *GRID})


def time_verify(bench, args, seqs: list[Sequence], bm: BlockManager, timed: bool = True) -> dict:
    """Warm-up, then `args.iters` timed verify passes of `args.speculative_k` + 1 positions per
    sequence (timed=False: the warm-up alone, for --compile-only)."""
    k, runner = args.speculative_k, bench.engine.runner
    timer = StepTimer(bench.device)
    gen = torch.Generator().manual_seed(k)
    warmup = max(1, args.warmup)
    times = []
    for i in range(warmup + (args.iters if timed else 0)):
        base = [len(s.completion_ids) for s in seqs]
        drafts = torch.randint(3, bench.config.vocab_size, (k, len(seqs)), generator=gen)
        for tokens in drafts.tolist():  # a page for each draft that starts one, as a round takes
            for seq, token in zip(seqs, tokens, strict=True):
                seq.completion_ids.append(token)
                if bm.needs_page(seq):
                    bm.append_page(seq)
        ms, _ = timer.time(lambda: runner.verify(seqs, [k + 1] * len(seqs), True))
        if i >= warmup:
            times.append(ms)
        for seq, b in zip(seqs, base, strict=True):  # the drafts taken back, their pages freed
            del seq.completion_ids[b:]
            keep = bm.pages_for_tokens(seq.num_tokens)
            if len(seq.page_table) > keep:
                bm.release_pages(seq, keep)
    return (summary(times) if times else {"steps_ms": []}) | {"draft_tokens": k}


def speculative_row(verify: dict, sparse_ms: float, dense_ms: float) -> dict:
    """The arm's figures for one configuration: its verify pass and, per acceptance a, the
    round's time and its speedup over dense decode."""
    k, verify_ms = verify["draft_tokens"], verify["step_ms"]
    round_ms = k * sparse_ms + verify_ms
    return verify | {
        "round_ms": round_ms,
        "verify_over_dense_step": verify_ms / dense_ms,
        "speedup_vs_dense": {
            f"{a:.3f}": expected_tokens_per_round(a, k) * dense_ms / round_ms for a in acceptances()
        },
    }
