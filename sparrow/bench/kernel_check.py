"""`sparrow-bench kernel-check`: every Triton kernel of the engine's decode step against its
PyTorch reference, at the decode-step headline's model shape, on a few pages.

    sparrow-bench kernel-check --json runs/kernel_check.json   # GPU: the compiled kernels
    sparrow-bench kernel-check                                 # CPU: the interpreter, tiny shape

The GPU check's kernels stage (scripts/gpu_check.sh) runs it before the timed headline, so that
a headline never comes back from kernels that compute the wrong thing. The kernels are the ones
a decode step launches (tests/rehearsal/test_launcher_rehearsal.py counts them per layer): the
RMSNorm with and without the residual add, q/k norm + RoPE, SwiGLU, the KV append with and
without the page summaries, Quest page scores, the page choice, and paged decode (split kernel,
with and without the split merge) over every page and over the chosen ones. Each runs through
the op the engine calls (sparrow.kernels.ops) on inputs laid out as the engine lays them
(strided q/k/v views of the fused projection, a shuffled page table padded to 16 columns,
summaries in the cache dtype); its reference is the torch path the engine runs without Triton.

Shapes: the model's (`--model`, default Qwen3-1.7B's on CUDA: hidden 2048, 16 q / 8 KV heads of
128, MLP 6144), pages of 16 tokens, `--rows` sequences (16) of budget + 1 to 3 x budget pages
(partial last pages, the last row within the budget), a budget of `--budget-pages` (16).
Dtypes: the headline's bf16 and fp32 (the norm kernels run in half precision only: the engine
takes torch's ops in fp32); on a CPU by default bf16 alone, 2 rows, a budget of 4 pages (the
interpreter's run: the least work with a sparse and a dense row). Cache slots no
token was written to hold NaN, so a kernel that reads one fails. Each comparison passes when
every element is finite and |got - ref| <= atol + rtol * |ref| (`compare`); the JSON lists
every comparison (its error, tolerance, mismatches), and the exit status is 1 when one failed.
"""

import argparse
import random
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from sparrow.bench.device import bench_device, interpret_triton_without_cuda

interpret_triton_without_cuda()  # before anything imports triton (transformers may)

from sparrow.bench.trainer_args import write_json  # noqa: E402
from sparrow.cli.errors import ArgumentParser, UserError  # noqa: E402
from sparrow.models.random_init import random_model_config  # noqa: E402

# (atol, rtol) per kernel and dtype for compiled kernels (tests/kernels/test_gpu_kernels.py's):
# bf16 results rounded like torch's ops land within one bf16 step (2^-7) of them; attention
# sums in another order, so its error is absolute; writes and the page choice are exact.
BF16_STEP = 2.0**-7
TOLERANCE = {
    "add_rms_norm": {torch.bfloat16: (0.0, BF16_STEP)},
    "qk_norm_rope": {torch.bfloat16: (2 * BF16_STEP, BF16_STEP)},
    "silu_mul": {torch.bfloat16: (1e-6, BF16_STEP), torch.float32: (1e-6, 1e-5)},
    "write_kv": {torch.bfloat16: (0.0, 0.0), torch.float32: (0.0, 0.0)},
    "page_scores": {torch.bfloat16: (1e-4, 1e-4), torch.float32: (1e-4, 1e-4)},
    "select_pages": {torch.bfloat16: (0.0, 0.0), torch.float32: (0.0, 0.0)},
    "paged_decode": {torch.bfloat16: (1.5e-2, 0.0), torch.float32: (1e-5, 0.0)},
}
# The interpreter truncates fp32 -> bf16 casts where compiled kernels round to nearest: each of
# up to three roundings can land one more bf16 step off (tests/kernels/test_norm_rope_triton.py).
INTERPRETED_BF16_RTOL = 3 * BF16_STEP
HALF_ONLY = ("add_rms_norm", "qk_norm_rope")  # fp32 models run torch's norm and RoPE ops


@dataclass
class Case:
    """One dtype's inputs: the model's widths, the decode batch's rows and pages, where."""

    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    eps: float
    rope_theta: float
    rows: int
    page_size: int
    budget_pages: int
    dtype: torch.dtype
    device: torch.device
    gen: torch.Generator
    interpreted: bool

    def randn(self, *shape: int, scale: float = 1.0) -> Tensor:
        x = torch.randn(shape, generator=self.gen, device=self.device)
        return (scale * x).to(self.dtype)

    def tolerance(self, kernel: str) -> tuple[float, float]:
        atol, rtol = TOLERANCE[kernel][self.dtype]
        if self.interpreted and self.dtype == torch.bfloat16 and rtol > 0:
            rtol = max(rtol, INTERPRETED_BF16_RTOL)
        return atol, rtol


def compare(kernel: str, case: str, dtype: torch.dtype, got: Tensor, ref: Tensor, atol: float,
            rtol: float) -> dict:  # fmt: skip
    """One comparison: ok when the shapes match and every element is finite and within
    atol + rtol * |ref| of the reference (atol = rtol = 0: equal). NaN never passes."""
    record = {"kernel": kernel, "case": case, "dtype": str(dtype).removeprefix("torch."),
              "atol": atol, "rtol": rtol}  # fmt: skip
    if tuple(got.shape) != tuple(ref.shape):
        return record | {"ok": False, "error": f"shape {tuple(got.shape)} != {tuple(ref.shape)}"}
    got64, ref64 = got.detach().cpu().double(), ref.detach().cpu().double()
    err = (got64 - ref64).abs()
    bad = ~(err <= atol + rtol * ref64.abs())  # NaN compares False: counted as bad
    finite = torch.isfinite(err)
    return record | {
        "elements": got64.numel(),
        "mismatched": int(bad.sum()),
        "nonfinite": int((~finite).sum()),
        "max_abs_err": float(err[finite].max()) if finite.any() else None,
        "max_abs_ref": float(ref64.abs().max()) if ref64.numel() else 0.0,
        "ok": not bool(bad.any()),
    }


def check_norms(c: Case) -> list[dict]:
    """RMSNorm with the residual add (every layer's two norms) and without (the first)."""
    from sparrow.kernels import ops
    from sparrow.kernels.norm_rope_triton import add_rms_norm_reference

    x, residual = c.randn(c.rows, c.hidden, scale=3.0), c.randn(c.rows, c.hidden)
    weight = (1 + 0.1 * torch.randn(c.hidden, generator=c.gen, device=c.device)).to(c.dtype)
    tol = c.tolerance("add_rms_norm")
    total, out = ops.add_rms_norm(x, weight, c.eps, residual)
    ref_total, ref_out = add_rms_norm_reference(x, weight, c.eps, residual)
    _, alone = ops.add_rms_norm(x, weight, c.eps)
    _, ref_alone = add_rms_norm_reference(x, weight, c.eps)
    return [compare("add_rms_norm", "residual sum", c.dtype, total, ref_total, *tol),
            compare("add_rms_norm", "with residual", c.dtype, out, ref_out, *tol),
            compare("add_rms_norm", "no residual", c.dtype, alone, ref_alone, *tol)]  # fmt: skip


def check_qk_norm_rope(c: Case) -> list[dict]:
    """q and k heads of the fused q/k/v projection (a strided view), normalised and rotated."""
    from sparrow.kernels import ops
    from sparrow.kernels.norm_rope_triton import qk_norm_rope_reference

    heads = c.q_heads + c.kv_heads
    qk = c.randn(c.rows, heads + c.kv_heads, c.head_dim)[:, :heads]  # (N, H_q + H_kv, D)
    weight = 1 + 0.1 * torch.randn(heads, c.head_dim, generator=c.gen, device=c.device)
    weight = weight.to(c.dtype)  # (H_q + H_kv, D)
    positions = torch.randint(0, 32768, (c.rows,), generator=c.gen, device=c.device).float()
    exponent = torch.arange(0, c.head_dim, 2, device=c.device).float() / c.head_dim
    freqs = positions[:, None] / c.rope_theta**exponent  # (N, D / 2)
    cos = torch.cat((freqs.cos(), freqs.cos()), -1).to(c.dtype)[:, None]  # (N, 1, D)
    sin = torch.cat((-freqs.sin(), freqs.sin()), -1).to(c.dtype)[:, None]  # sign folded in
    got = ops.qk_norm_rope(qk, weight, cos, sin, c.eps)
    ref = qk_norm_rope_reference(qk, weight, cos, sin, c.eps)
    return [compare("qk_norm_rope", "q/k heads", c.dtype, got, ref, *c.tolerance("qk_norm_rope"))]


def check_silu_mul(c: Case) -> list[dict]:
    from sparrow.kernels import ops
    from sparrow.kernels.swiglu_triton import silu_mul_reference

    gate_up = c.randn(c.rows, 2 * c.intermediate, scale=3.0)  # (N, 2 I)
    got, ref = ops.silu_mul(gate_up), silu_mul_reference(gate_up)
    return [compare("silu_mul", "gate/up", c.dtype, got, ref, *c.tolerance("silu_mul"))]


@dataclass
class Pages:
    """A decode batch's paged K/V: shuffled physical pages, NaN wherever no token was written."""

    k_cache: Tensor  # (num_pages, PAGE, H_kv, D)
    v_cache: Tensor  # (num_pages, PAGE, H_kv, D)
    page_table: Tensor  # (B, P) int32, P a multiple of 16 (the engine pads it), unused -1
    seq_lens: Tensor  # (B,) int32
    budgets: Tensor  # (B,) int32


def paged_batch(c: Case) -> Pages:
    """Rows of budget + 1 to 3 x budget pages with partial last pages, the last row within its
    budget (a dense row of a sparse step)."""
    from sparrow.kernels import write_kv

    ps = c.page_size
    lens = [ps * (c.budget_pages + 1 + (7 * i) % (2 * c.budget_pages)) - (5 * i) % ps
            for i in range(c.rows - 1)] + [ps * (c.budget_pages - 2) + 1]  # fmt: skip
    pages = [-(-n // ps) for n in lens]
    num_pages = sum(pages) + 3  # spare pages: never read
    shape = (num_pages, ps, c.kv_heads, c.head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=c.dtype, device=c.device)
    v_cache = torch.full_like(k_cache, float("nan"))
    order = torch.randperm(num_pages, generator=c.gen, device=c.device).to(torch.int32)
    table = torch.full((c.rows, -(-max(pages) // 16) * 16), -1, dtype=torch.int32, device=c.device)
    used = 0
    for b, (n_tokens, n_pages) in enumerate(zip(lens, pages, strict=True)):
        table[b, :n_pages] = order[used : used + n_pages]
        used += n_pages
        positions = torch.arange(n_tokens, device=c.device)
        slots = table[b, positions // ps].long() * ps + positions % ps
        # A per-page offset gives pages distinct summaries: no near-ties in the choice.
        offset = c.randn(n_pages, 1, c.head_dim).repeat_interleave(ps, 0)[:n_tokens]
        keys = c.randn(n_tokens, c.kv_heads, c.head_dim) + offset
        write_kv(k_cache, v_cache, keys, c.randn(n_tokens, c.kv_heads, c.head_dim), slots)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=c.device)
    budgets = torch.full((c.rows,), c.budget_pages, dtype=torch.int32, device=c.device)
    return Pages(k_cache, v_cache, table, seq_lens, budgets)


def check_write_kv(c: Case, p: Pages) -> list[dict]:
    """Each row's input token written to its slot (the last one: seq_lens count it), with its
    page's Quest summary refreshed in the same launch (a sparse layer) and without (a dense
    layer). The caches' NaN slots made finite first: every element is compared."""
    from sparrow.kernels import PageSummary, append_kv, ops, update_page_summaries

    qkv = c.randn(c.rows, c.q_heads + 2 * c.kv_heads, c.head_dim)
    k, v = qkv[:, c.q_heads : c.q_heads + c.kv_heads], qkv[:, c.q_heads + c.kv_heads :]
    position = p.seq_lens.long() - 1  # (B,)
    page = p.page_table.gather(1, (position // c.page_size)[:, None])[:, 0].long()
    slots = page * c.page_size + position % c.page_size  # (B,)
    k_cache, v_cache = p.k_cache.nan_to_num(7.0), p.v_cache.nan_to_num(7.0)
    num_pages = k_cache.shape[0]
    tol = c.tolerance("write_kv")
    records = []
    for summaries in (True, False):
        caches, refs = [k_cache.clone(), v_cache.clone()], [k_cache.clone(), v_cache.clone()]
        summary = ref_summary = None
        if summaries:
            summary = PageSummary.empty(num_pages, c.kv_heads, c.head_dim, c.device,
                                        score="quest", dtype=c.dtype)  # fmt: skip
            every = torch.arange(num_pages, device=c.device)
            full = torch.full((num_pages,), c.page_size, device=c.device)
            update_page_summaries(k_cache, summary, every, full)  # the state before the step
            ref_summary = PageSummary(None, *(t.clone() for t in summary.tables))  # min, max
        ops.write_kv(caches[0], caches[1], k, v, slots, summary)
        append_kv(refs[0], refs[1], k, v, slots, ref_summary, backend="torch")
        name = "with summaries" if summaries else "no summaries"
        records += [
            compare("write_kv", f"k cache, {name}", c.dtype, caches[0], refs[0], *tol),
            compare("write_kv", f"v cache, {name}", c.dtype, caches[1], refs[1], *tol),
        ]
        if summary is not None and ref_summary is not None:
            for table in ("k_min", "k_max"):
                got, ref = getattr(summary, table), getattr(ref_summary, table)
                records.append(compare("write_kv", table, c.dtype, got, ref, *tol))
    return records


def check_decode(c: Case, p: Pages) -> list[dict]:
    """Quest scores, the page choice from them, then paged decode over every page and over the
    chosen ones, with the launcher's own split count, with one split (no merge) and with four."""
    from sparrow.kernels import PageSummary, SelectedPages, ops, paged_decode, update_page_summaries
    from sparrow.kernels.decode_triton import paged_decode_triton
    from sparrow.kernels.selection import page_scores_torch, select_from_scores, selection_plan

    rule: dict[str, int] = {"page_size": c.page_size, "num_sink": 1, "num_recent": 2}
    num_pages = p.k_cache.shape[0]
    summary = PageSummary.empty(num_pages, c.kv_heads, c.head_dim, c.device, score="quest",
                                dtype=c.dtype)  # fmt: skip
    pages = [int(x) for x in p.page_table.flatten().tolist() if x >= 0]
    lens = p.seq_lens.tolist()
    ps = c.page_size
    fills = [min(ps, n - i * ps) for n in lens for i in range(-(-n // ps))]  # tokens per page
    update_page_summaries(p.k_cache, summary, torch.tensor(pages, device=c.device),
                          torch.tensor(fills, device=c.device))  # fmt: skip
    qk = c.randn(c.rows, c.q_heads + 2 * c.kv_heads, c.head_dim)
    q = qk[:, : c.q_heads]  # (B, H_q, D): a strided view, as the engine passes it
    plan = selection_plan(p.page_table, p.seq_lens, p.budgets, page_size=c.page_size,
                          num_sink=1, num_recent=2, trim=True)  # fmt: skip
    table = p.page_table[:, : plan.phys.shape[1]]
    scores = ops.page_scores(q, summary, table, p.seq_lens, "quest", c.page_size)
    fp32 = PageSummary(None, *(t.float() for t in summary.tables))  # quest: min, max
    ref_scores = page_scores_torch(q.float(), fp32, table, p.seq_lens, "quest", c.page_size, plan)
    num_logical = (p.seq_lens.long() + c.page_size - 1) // c.page_size  # (B,)
    columns = torch.arange(table.shape[1], device=c.device)
    valid = (columns < num_logical[:, None])[:, None].expand_as(scores)  # (B, H_kv, P) in use
    atol, rtol = c.tolerance("page_scores")
    atol *= float(ref_scores[valid].abs().max())  # relative to the scores' magnitude
    records = [compare("page_scores", "quest", c.dtype, scores[valid], ref_scores[valid], atol,
                       rtol)]  # fmt: skip
    chosen = ops.select_pages(scores, table, p.seq_lens, p.budgets, plan.num_selected,
                              plan.max_selected, **rule)  # fmt: skip
    ref_chosen = select_from_scores(scores, p.seq_lens, p.budgets, plan=plan, **rule)
    counts = plan.num_selected.long()
    slots = torch.arange(plan.max_selected, device=c.device)
    kept = (slots < counts[:, None])[:, None].expand_as(chosen.logical_pages)
    tol = c.tolerance("select_pages")
    for name in ("logical_pages", "physical_pages"):
        got, ref = getattr(chosen, name), getattr(ref_chosen, name)
        records.append(compare("select_pages", name, c.dtype, got[kept], ref[kept], *tol))
    selected = SelectedPages(ref_chosen.logical_pages, plan.num_selected,
                             ref_chosen.physical_pages)  # fmt: skip
    args = (q, p.k_cache, p.v_cache, p.page_table, p.seq_lens)
    tol = c.tolerance("paged_decode")
    for arm, sel in (("dense", None), ("sparse", selected)):
        ref = paged_decode(*args, sel, backend="torch")
        got = ops.paged_decode(*args, sel, c.head_dim**-0.5)  # the launcher's split count
        records.append(compare("paged_decode", f"{arm}, auto splits", c.dtype, got, ref, *tol))
        for splits in (1, 4):  # 1: the split kernel writes the output; 4: and the merge kernel
            got = paged_decode_triton(*args, sel, c.head_dim**-0.5, num_splits=splits)
            case = f"{arm}, {splits} split{'s' if splits > 1 else ''}"
            records.append(compare("paged_decode", case, c.dtype, got, ref, *tol))
    return records


def run_case(c: Case) -> list[dict]:
    """Every kernel's comparisons in one dtype (the norm kernels in half precision only)."""
    records = []
    if c.dtype != torch.float32:
        records += check_norms(c) + check_qk_norm_rope(c)
    records += check_silu_mul(c)
    p = paged_batch(c)
    return records + check_write_kv(c, p) + check_decode(c, p)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="sparrow-bench kernel-check", description=__doc__.split("\n")[0])
    p.add_argument("--device", default=None, help="default: CUDA when present, else the CPU")
    p.add_argument("--model", default=None,
                   help="the model's widths (random_init.py); default: the decode-step headline's "
                   "on CUDA (qwen3-1.7b), qwen3-debug on the CPU")  # fmt: skip
    p.add_argument("--rows", type=int, default=None, help="sequences (default 16; CPU 2)")
    p.add_argument("--budget-pages", type=int, default=None,
                   help="sparse rows' budget, >= 4 (default 16: the selection's slot stride a "
                   "multiple of 16, as the headline's 128, so the check meets its compiled "
                   "variants; CPU 4)")  # fmt: skip
    p.add_argument("--dtypes", nargs="+", default=None, choices=["bfloat16", "float32"],
                   help="default: both on CUDA; bfloat16 on the CPU")  # fmt: skip
    p.add_argument("--seed", type=int, default=None, help="default: a fresh one, in the JSON")
    p.add_argument("--json", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    args.device = torch.device(args.device) if args.device else bench_device()
    gpu = args.device.type == "cuda"
    args.model = args.model or ("qwen3-1.7b" if gpu else "qwen3-debug")
    # The CPU run is the interpreter's (tests, the GPU check's CPU rehearsal): the least work
    # that still has a sparse and a dense row, in the headline's dtype.
    args.dtypes = args.dtypes or (["bfloat16", "float32"] if gpu else ["bfloat16"])
    args.rows = args.rows or (16 if gpu else 2)
    args.budget_pages = args.budget_pages or (16 if gpu else 4)
    args.seed = random.randrange(1 << 31) if args.seed is None else args.seed
    if args.rows < 2 or args.budget_pages < 4:
        p.error("--rows must be >= 2 and --budget-pages >= 4 (sink + recent + one by score)")
    return args


def build_case(args, config, dtype: str, interpreted: bool) -> Case:
    """One dtype's comparison inputs at the model's widths, on `args.device`."""
    return Case(
        hidden=config.hidden_size, intermediate=config.intermediate_size,
        q_heads=config.num_attention_heads, kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim, eps=config.rms_norm_eps,
        rope_theta=getattr(config, "rope_theta", 1e6), rows=args.rows, page_size=16,
        budget_pages=args.budget_pages, dtype=getattr(torch, dtype), device=args.device,
        gen=torch.Generator(device=args.device).manual_seed(args.seed), interpreted=interpreted,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from sparrow.kernels import decode_triton

    interpreted = decode_triton.INTERPRETED
    if args.device.type != "cuda" and not interpreted:
        raise UserError("the kernels need CUDA, or TRITON_INTERPRET=1 before triton is imported")
    config = random_model_config(args.model)
    start = time.perf_counter()
    report = {
        "bench": "kernel-check",
        "device": torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu",
        "interpreted": interpreted, "model": args.model, "seed": args.seed,
        "shapes": {"rows": args.rows, "hidden": config.hidden_size,
                   "intermediate": config.intermediate_size,
                   "q_heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads,
                   "head_dim": config.head_dim, "page_size": 16,
                   "budget_pages": args.budget_pages},
        "dtypes": args.dtypes, "checks": [], "failed": [],
    }  # fmt: skip
    for name in args.dtypes:
        records = run_case(build_case(args, config, name, interpreted))
        report["checks"] += records
        report["failed"] += [f"{r['kernel']} ({r['case']}, {r['dtype']})" for r in records
                             if not r["ok"]]  # fmt: skip
        report["seconds"] = round(time.perf_counter() - start, 1)
        write_json(args.json, report, announce=False)  # a dtype done survives a later timeout
        print(f"kernel-check {name}: {sum(r['ok'] for r in records)}/{len(records)} comparisons "
              f"passed ({report['seconds']} s)", flush=True)  # fmt: skip
    for line in report["failed"]:
        print(f"sparrow-bench kernel-check: FAILED {line}")
    return 1 if report["failed"] else 0
