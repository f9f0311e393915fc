"""The eager decode plan pads like the benchmark: with `column_multiple` (16 when the runner's
kernels are Triton's) every step's page-table width and selection counts are multiples of it, so
a row crossing into a new page does not change what Triton specialises on (an integer argument or
stride divisible by 16 or not) mid-generation; `min_columns` holds the width fixed."""

import torch

from sparrow.rollout.block_manager import BlockManager
from sparrow.rollout.decode_plan import DecodePlan
from sparrow.rollout.sequence import Sequence

PAGE = 4


def plan(column_multiple: int, pad_shapes: bool = False) -> DecodePlan:
    return DecodePlan(page_size=PAGE, num_sink=1, num_recent=2, scratch_page=500,
                      device=torch.device("cpu"), pad_shapes=pad_shapes,
                      column_multiple=column_multiple, slots=2, columns=64)  # fmt: skip


def widths(p: DecodePlan, steps: int, prompt: int = 63, budget: int = 40) -> list[tuple]:
    """(columns, max_selected, max_top) of `steps` steps of two rows growing one token a step
    across page boundaries (16 -> 17 pages at 64 -> 65 tokens)."""
    bm = BlockManager(num_pages=200, page_size=PAGE)
    seqs = [Sequence(i, 0, list(range(3, 3 + prompt + i)), max_tokens=1 << 10) for i in range(2)]
    bm.allocate_prefill(seqs[:1])
    bm.allocate_prefill(seqs[1:])
    shapes = []
    for _ in range(steps):
        for s in seqs:
            s.completion_ids.append(7)
            if bm.needs_page(s):
                bm.append_page(s)
        step = p.update(seqs, [budget, budget])
        shapes.append((step.page_table.shape[1], step.max_selected, step.max_top))
    return shapes


def test_eager_widths_are_multiples_of_16_across_a_page_boundary():
    shapes = widths(plan(16), steps=6)
    assert {s[0] for s in shapes} == {32}  # 17 pages and more -> 32 columns
    assert all(c % 16 == 0 and sel % 16 == 0 and top % 16 == 0 for c, sel, top in shapes)


def test_unpadded_widths_follow_the_rows():
    """column_multiple 1 (the CPU kernels): as before, the width is the longest row's pages."""
    shapes = widths(plan(1), steps=6)
    assert [c for c, _, _ in shapes] == [17, 17, 17, 17, 18, 18]


def test_min_columns_fixes_the_width_eager_and_bucketed():
    for pad in (False, True):
        p = plan(16, pad_shapes=pad)
        p.min_columns = 40
        shapes = widths(p, steps=8, prompt=60, budget=12)  # 16 -> 18 pages
        assert len(set(shapes)) == 1, shapes
        assert shapes[0][0] == (48 if not pad else 40)  # bucket(40) = 40


def test_the_runner_pads_eager_steps_with_triton_kernels_only(monkeypatch):
    from sparrow.bench import decode_step

    args = ["--dtype", "float32", "--context", "32", "--batches", "2", "--samples", "2",
            "--budget-tokens", "16", "--graphs", "off"]  # fmt: skip
    for backend, multiple in (("torch", 1), ("triton", 16)):
        bench = decode_step.build(decode_step.parse_args(args + ["--backend", backend]))
        assert bench.engine.runner.plan.column_multiple == multiple, backend
