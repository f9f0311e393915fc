"""The Triton kernels as torch ops (kernels/ops.py): each fake implementation gives the outputs the
real one returns (shape, dtype, device, strides), on tiny shapes with the real kernels in the
interpreter; `torch.library.opcheck` accepts every op; the engine's Triton path launches every
kernel through an op; importing the ops imports no Triton.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import subprocess  # noqa: E402
import sys  # noqa: E402
from collections import Counter  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hang_guard import HANG_GUARD_S  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map_only  # noqa: E402

from sparrow.bench.dispatch_counter import DispatchCounter, count_triton_launches  # noqa: E402
from sparrow.bench.random_runner import advance, prefilled_runner, qwen3_1p7b_shaped  # noqa: E402
from sparrow.kernels import decode_triton, select_pages, selection_plan  # noqa: E402

if not decode_triton.INTERPRETED:
    pytest.skip("Triton was imported before TRITON_INTERPRET was set", allow_module_level=True)

OPS = ("paged_decode", "page_scores", "select_pages", "write_kv", "rms_norm", "add_rms_norm",
       "qk_norm_rope", "silu_mul")  # fmt: skip
# The kernels each op launches (the merge of split-KV decode only runs on CUDA at > 1 split).
KERNELS = {
    "paged_decode": "_decode_split_kernel",
    "page_scores": "_page_score_kernel",
    "select_pages": "_select_pages_kernel",
    "write_kv": "_write_kv_kernel",
    "rms_norm": "_add_rms_norm_kernel",
    "add_rms_norm": "_add_rms_norm_kernel",
    "qk_norm_rope": "_qk_norm_rope_kernel",
    "silu_mul": "_silu_mul_kernel",
}


def op_args(paged_batch) -> dict[str, tuple]:
    """Tiny inputs of every op: GQA 2 x 2 heads, head dim 16, 4-token pages, bf16 where the
    engine runs bf16 (the summaries in fp32, as a test batch writes them)."""
    g = torch.Generator().manual_seed(0)
    b = paged_batch([19, 9], num_kv_heads=2, group=2, head_dim=16, page_size=4)
    bf = torch.bfloat16
    q, k_cache, v_cache = (t.to(bf) for t in (b.q, b.k_cache, b.v_cache))
    tables = (b.summary.k_mean, b.summary.k_min, b.summary.k_max)
    budgets = torch.tensor([3, 3], dtype=torch.int32)
    rule = dict(page_size=4, num_sink=1, num_recent=1)
    plan = selection_plan(b.page_table, b.seq_lens, budgets, **rule, trim=True)
    table = b.page_table[:, : plan.phys.shape[1]]
    scores = torch.ops.sparrow.page_scores.default(q, *tables, table, b.seq_lens, "quest", 4)
    selected = select_pages(q, b.summary, b.page_table, b.seq_lens, budgets, score="quest",
                            backend="triton", plan=plan, **rule)  # fmt: skip
    sel = (selected.logical_pages, selected.physical_pages, selected.num_selected)
    n, h, d = 3, 4, 16
    x = torch.randn(n, 32, generator=g).to(bf)
    kv = torch.randn(n, 2, 2, 16, generator=g)  # (N, K/V, H_kv, D)
    slots = torch.tensor([17, 18, 30])  # pages 4 and 7, a page start and two later offsets
    return {
        "paged_decode": (q, k_cache, v_cache, b.page_table, b.seq_lens, *sel, 0.25),
        "page_scores": (q, *tables, table, b.seq_lens, "quest", 4),
        "select_pages": (
            scores,
            table,
            b.seq_lens,
            budgets,
            plan.num_selected,
            plan.max_selected,
            4,
            1,
            1,
        ),  # fmt: skip
        "write_kv": (
            b.k_cache.nan_to_num(0.0),
            b.v_cache.nan_to_num(0.0),
            kv[:, 0],
            kv[:, 1],
            slots,
            *tables,
        ),  # fmt: skip
        "rms_norm": (x, torch.randn(32, generator=g).to(bf), 1e-6),
        "add_rms_norm": (x, x.flip(0), torch.randn(32, generator=g).to(bf), 1e-6),
        "qk_norm_rope": (
            torch.randn(n, h, d, generator=g).to(bf),
            torch.randn(h, d).to(bf),
            torch.randn(n, 1, d).to(bf),
            torch.randn(n, 1, d).to(bf),
            1e-6,
        ),  # fmt: skip
        "silu_mul": (torch.randn(n, 64, generator=g).to(bf),),
    }


def clone_args(args: tuple) -> tuple:
    return tree_map_only(torch.Tensor, torch.Tensor.clone, args)


def layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.dtype, t.device.type, t.stride()


@pytest.mark.parametrize("name", OPS)
def test_fake_outputs_match_the_real_kernels(name, paged_batch):
    args = op_args(paged_batch)[name]
    op = getattr(torch.ops.sparrow, name).default
    real = op(*clone_args(args))
    with FakeTensorMode() as mode:
        fake_args = tree_map_only(torch.Tensor, mode.from_tensor, args)
        fake = op(*fake_args)
    real_out = [t for t in tree_flatten(real)[0] if t is not None]  # write_kv returns None
    fake_out = [t for t in tree_flatten(fake)[0] if t is not None]
    assert len(real_out) == len(fake_out)
    for r, f in zip(real_out, fake_out, strict=True):
        assert layout(f) == layout(r)
    mutated = [a.name for a in op._schema.arguments if a.alias_info and a.alias_info.is_write]
    assert mutated == (["k_cache", "v_cache", "k_mean", "k_min", "k_max"] if name == "write_kv"
                       else [])  # fmt: skip


def test_write_kv_writes_only_what_its_schema_declares(paged_batch):
    args = clone_args(op_args(paged_batch)["write_kv"])
    before = clone_args(args)
    torch.ops.sparrow.write_kv.default(*args)
    changed = [not torch.equal(a, b) for a, b in zip(args, before, strict=True)
               if isinstance(a, torch.Tensor)]  # fmt: skip
    # k_cache, v_cache, k, v, slots, k_mean, k_min, k_max
    assert changed == [True, True, False, False, False, True, True, True]


def test_fake_rejects_a_cpu_tensor_among_cuda_ones(paged_batch):
    qk, weight, cos, sin, eps = op_args(paged_batch)["qk_norm_rope"]
    with FakeTensorMode():

        def on_cuda(t):
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")

        cuda = [on_cuda(t) for t in (qk, weight, cos, sin)]
        assert torch.ops.sparrow.qk_norm_rope.default(*cuda, eps).device.type == "cuda"
        on_cpu = torch.empty(weight.shape, dtype=weight.dtype)  # a fake CPU tensor
        with pytest.raises(ValueError, match="all tensors must be on one device"):
            torch.ops.sparrow.qk_norm_rope.default(cuda[0], on_cpu, *cuda[2:], eps)


@pytest.mark.parametrize("name", OPS)
def test_opcheck(name, paged_batch):
    args = op_args(paged_batch)[name]
    op = getattr(torch.ops.sparrow, name).default
    # Schema (mutations as declared), autograd registration, fake vs real, and AOT dispatch
    # with dynamic shapes (the fake implementations under symbolic sizes).
    torch.library.opcheck(op, clone_args(args))


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "sparrow":
            self.calls[func._schema.name.split("::")[1]] += 1
        return func(*args, **(kwargs or {}))


def test_engine_launches_every_triton_kernel_through_an_op():
    """A bf16 Triton-backend decode step (the GPU path, in the interpreter): each kernel runs
    exactly as often as the op that wraps it, so none is launched around the ops."""
    config = qwen3_1p7b_shaped(layers=3)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 4, 2, 16
    runner, seqs, bm = prefilled_runner(config, torch.bfloat16, "triton", [19], page_size=4)
    modules = [m for n, m in sys.modules.items() if n.startswith("sparrow.kernels.") and m]
    for budgets in ([4], None):  # a sparse step, then a dense one
        counter, ops = DispatchCounter(), _OpCounter()
        with count_triton_launches(modules, counter), ops:
            logits = runner.decode(seqs, budgets, update_summaries=True)
        advance(seqs, bm, logits)
        launches = Counter()
        for op, n in ops.calls.items():
            launches[KERNELS[op]] += n
        assert launches == Counter(counter.triton_launches), (ops.calls, counter.triton_launches)
        assert ops.calls["write_kv"] == 3 and ops.calls["paged_decode"] == 3
        assert ops.calls["select_pages"] == (1 if budgets else 0)  # layers 0, 1 are dense


def test_importing_the_ops_imports_no_triton():
    code = (
        "import sys, torch, sparrow.kernels, sparrow.rollout.engine\n"
        "assert 'triton' not in sys.modules, 'triton imported'\n"
        "print(torch.ops.sparrow.paged_decode.default._schema)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=HANG_GUARD_S,
    )
    assert "sparrow::paged_decode(Tensor q" in out.stdout
