"""Exactness (b) of speculative rollouts, by enumeration: the accept/resample rule
(speculative.accept_rounds, the batched rule the engine's rounds call, here with the enumerated
sequence between two others), given explicit draft and target distributions after
temperature, top-p and top-k, emits exactly the target's law. No sampling: every draft path of
a small vocabulary is enumerated with its probability, the acceptance probability of each draft
is read off the rule as the measure of the uniforms that keep it (the boundary found by
bisection), and each resampled or bonus token's law is the weights the rule hands its draw. The
law of the first three emitted tokens (k = 2: two drafts and the bonus) must equal the dense
policy's p0(y0) p1(y1 | y0) p2(y2 | y0, y1) to float32 rounding; targets and drafts depend on
the context, as a model's do. Rejected-at-0 paths continue from the dense law (the next round's
first token, which is what the same check at position 0 proves).
"""

import itertools

import pytest
import torch

from sparrow.rollout.sampler import Distributions
from sparrow.rollout.speculative import accept_rounds

VOCAB = 7
K = 2
TOLERANCE = 1e-5  # float32 probabilities and thresholds (~1e-7 each), summed over paths


class Tables:
    """Context-dependent processed distributions: p0 (V,), p1 (V, V) given y0, p2 (V, V, V)
    given (y0, y1) for the target; q0, q1 for the draft (target logits plus noise)."""

    def __init__(self, temperature, top_p, top_k, seed, draft_noise=1.0):
        gen = torch.Generator().manual_seed(seed)

        def both(shape):
            target = torch.randn(*shape, VOCAB, generator=gen) * 1.5
            draft = target + draft_noise * torch.randn(*shape, VOCAB, generator=gen)
            return [
                Distributions(x.reshape(-1, VOCAB), temperature, top_p, top_k)
                .probs()
                .reshape(*shape, VOCAB)
                for x in (target, draft)
            ]

        (self.p0, self.q0), (self.p1, self.q1), (self.p2, _) = (
            both((1,)),
            both((VOCAB,)),
            both((VOCAB, VOCAB)),
        )
        self.p0, self.q0 = self.p0[0], self.q0[0]

    def dense_law(self) -> torch.Tensor:
        """(V, V, V) float64: P(y0, y1, y2) under dense sampling."""
        p0, p1, p2 = self.p0.double(), self.p1.double(), self.p2.double()
        return p0[:, None, None] * p1[:, :, None] * p2


class Neighbours:
    """Two more sequences in every call, before and after the enumerated one: 3 drafts (the
    first two stand, the third is rejected) and none (its bonus row only), so the batched
    rule's row offsets are exercised; their outcomes must not depend on the enumerated path."""

    def __init__(self, seed=5):
        gen = torch.Generator().manual_seed(seed)
        self.p_before = torch.softmax(torch.randn(4, VOCAB, generator=gen), -1)  # (3 + 1, V)
        self.q_before = torch.softmax(torch.randn(3, VOCAB, generator=gen), -1)  # (3, V)
        self.drafts = drafts = [int(self.q_before[i].argmax()) for i in range(3)]
        ratio = [float(self.p_before[i, t] / self.q_before[i, t]) for i, t in enumerate(drafts)]
        # u below min(1, p/q) keeps a draft, u at or above it rejects it.
        self.uniforms = torch.tensor([ratio[0] * 0.5, min(ratio[1], 1.0) * 0.5, 0.999999])
        assert ratio[2] < 0.999999, "the third draft must be rejectable"
        self.p_after = torch.softmax(torch.randn(1, VOCAB, generator=gen), -1)  # (1, V)
        residual = (self.p_before[2] - self.q_before[2]).clamp(min=0.0).double()
        self.expected = [(2, residual / residual.sum()), (0, self.p_after[0].double())]
        self.seen: list[tuple[int, torch.Tensor]] = []  # (drafts kept, draw weights) per call


NEIGHBOURS = Neighbours()
TOP = 1.0 - 2.0**-24  # the largest float32 below 1


def _round(tables: Tables, paths: list[tuple[int, int]], uniforms: torch.Tensor):
    """One call of the batched rule (accept_rounds) on every draft path at once (a sequence
    each, uniforms (paths, K)), between the neighbours; the draw hands back each sequence's
    normalised weights (float64) in place of a token. Returns the paths' drafts kept (paths,)
    and the weights of their drawn tokens (paths, V)."""
    nb = NEIGHBOURS
    x0, x1 = torch.tensor(paths).T  # (paths,) each
    q = torch.stack([tables.q0.expand(len(paths), VOCAB), tables.q1[x0]], 1)  # (paths, K, V)
    p = torch.stack([tables.p0.expand(len(paths), VOCAB), tables.p1[x0], tables.p2[x0, x1]], 1)
    q = torch.cat([nb.q_before, q.flatten(0, 1)])  # (3 + paths K, V)
    p = torch.cat([nb.p_before, p.flatten(0, 1), nb.p_after])  # (4 + paths (K + 1) + 1, V)
    seen = []

    def draw_rows(weights):  # (S, V) -> (S,)
        seen.append(weights.double() / weights.double().sum(-1, keepdim=True))
        return torch.full((weights.shape[0],), -1)

    tokens = [nb.drafts, *map(list, paths), []]
    uniforms = torch.cat([nb.uniforms, uniforms.flatten()])
    verdicts = accept_rounds(q, p, tokens, uniforms, draw_rows)
    (weights,) = seen
    NEIGHBOURS.seen += [(verdicts[row].num_accepted, weights[row]) for row in (0, -1)]
    kept = torch.tensor([v.num_accepted for v in verdicts[1:-1]])
    return kept, weights[1:-1]


def assert_the_neighbours_kept_their_outcome():
    """Every call gave the neighbours their own verdicts: the batch's sequences are apart."""
    for i, (j, weights) in enumerate(NEIGHBOURS.seen):
        expected_j, law = NEIGHBOURS.expected[i % 2]
        assert j == expected_j and torch.allclose(weights, law, atol=1e-6), (i % 2, j, weights)
    NEIGHBOURS.seen.clear()


def acceptance(tables, paths, i: int) -> torch.Tensor:
    """(paths,) float64 P(draft i stands | the drafts before it stand): the measure of u in
    [0, 1) that keeps it, the drafts before i held at u = 0 (they stand whenever they can).
    The rule's event is one side of a threshold in u; bisection finds it (32 halvings)."""

    def stands(u: torch.Tensor) -> torch.Tensor:  # (paths,) -> (paths,) bool
        uniforms = torch.zeros(len(paths), K)
        uniforms[:, i] = u
        return _round(tables, paths, uniforms)[0] > i

    low_side = stands(torch.zeros(len(paths)))
    lo, hi = torch.zeros(len(paths), dtype=torch.float64), torch.full((len(paths),), TOP)
    constant = stands(hi) == low_side
    for _ in range(32):
        mid = (lo + hi) / 2
        same = stands(mid.float()) == low_side
        lo, hi = torch.where(same, mid, lo), torch.where(same, hi, mid)
    measure = torch.where(low_side, lo, 1.0 - lo)
    return torch.where(constant, low_side.double(), measure)


def emitted_law(tables: Tables) -> torch.Tensor:
    """(V, V, V) float64: P(y0, y1, y2) of the tokens a speculative round (and, after an early
    rejection, the dense continuation) emits, enumerated over every draft path."""
    paths = [
        (x0, x1)
        for x0, x1 in itertools.product(range(VOCAB), repeat=K)
        if tables.q0[x0] * tables.q1[x0, x1] > 0
    ]
    a0, a1 = acceptance(tables, paths, 0), acceptance(tables, paths, 1)
    forced = {  # uniforms that reject at 0, reject at 1, keep both: (drafts kept, weights)
        branch: _round(tables, paths, torch.tensor(u).expand(len(paths), K))
        for branch, u in (("reject0", [TOP, 0.0]), ("reject1", [0.0, TOP]), ("bonus", [0.0, 0.0]))
    }
    law = torch.zeros(VOCAB, VOCAB, VOCAB, dtype=torch.float64)
    p1, p2 = tables.p1.double(), tables.p2.double()
    for n, (x0, x1) in enumerate(paths):
        path = float(tables.q0[x0]) * float(tables.q1[x0, x1])
        a1[n] = a1[n] if a0[n] > 0 else 0.0
        for branch, (kept, weights) in forced.items():
            mass = {
                "reject0": 1 - a0[n],  # y0 from the residual, then the dense continuation
                "reject1": a0[n] * (1 - a1[n]),  # x0 stands, y1 from the residual
                "bonus": a0[n] * a1[n],  # both stand: the bonus token
            }[branch]
            if mass == 0:
                continue
            assert int(kept[n]) == {"reject0": 0, "reject1": 1, "bonus": K}[branch]
            w = weights[n]
            if branch == "reject0":
                law += path * mass * w[:, None, None] * p1[:, :, None] * p2
            elif branch == "reject1":
                law[x0] += path * mass * w[:, None] * p2[x0]
            else:
                law[x0, x1] += path * mass * w
    return law


@pytest.mark.parametrize(
    "temperature, top_p, top_k",
    [(1.0, 1.0, None), (0.7, 0.9, None), (1.3, 1.0, 3), (0.8, 0.8, 4), (0.0, 1.0, None)],
    ids=["plain", "temperature-top_p", "top_k", "all-three", "greedy"],
)
def test_the_rule_emits_exactly_the_dense_law(temperature, top_p, top_k):
    NEIGHBOURS.seen.clear()
    tables = Tables(temperature, top_p, top_k, seed=0)
    expected, got = tables.dense_law(), emitted_law(tables)
    assert abs(float(got.sum()) - 1.0) < TOLERANCE
    worst = float((got - expected).abs().max())
    assert worst < TOLERANCE, f"max |P_spec - P_dense| over (y0, y1, y2): {worst:.2e}"
    assert_the_neighbours_kept_their_outcome()
    # The case is not trivial: in some context a draft is rejected with a real probability,
    # and under truncation the draft puts mass where the target puts none.
    p, q = torch.cat([tables.p0[None], tables.p1]), torch.cat([tables.q0[None], tables.q1])
    assert torch.minimum(p, q).sum(-1).min() < 0.9
    if top_k is not None or top_p < 1.0:
        assert ((q > 0) & (p == 0)).any()


def test_a_draft_that_is_the_target_always_stands():
    """q = p: every draft is accepted with probability 1 (no uniform rejects it), and the
    emitted law is still exactly the dense one (through the bonus token)."""
    NEIGHBOURS.seen.clear()
    tables = Tables(1.0, 1.0, None, seed=3, draft_noise=0.0)
    paths = list(itertools.product(range(VOCAB), repeat=K))
    assert bool((acceptance(tables, paths, 0) == 1).all())
    assert bool((acceptance(tables, paths, 1) == 1).all())
    worst = float((emitted_law(tables) - tables.dense_law()).abs().max())
    assert worst < TOLERANCE, worst
    assert_the_neighbours_kept_their_outcome()
