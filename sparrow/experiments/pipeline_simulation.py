"""A cost simulation, not a measurement, of the GPU layout of a GRPO step (issue 51 item 5):
Qwen3-1.7B, 32K-token rows, 8 H200s; colocated synchronous against one-step-off with R rollout
and 8 - R training GPUs; dense against sparse rollouts. docs/pipeline/README.md has the formula:

    python -m sparrow.experiments.pipeline_simulation           # rewrite the table
    python -m sparrow.experiments.pipeline_simulation --check   # exit 1 if the table is stale
"""

import argparse
import json
import sys
from dataclasses import dataclass, fields, replace
from functools import cache
from pathlib import Path
from types import SimpleNamespace

from sparrow.control.cost_model import CostConfig, decode_cost, weights_read
from sparrow.control.schedule import BudgetSchedule, build_schedule, load_schedule_config
from sparrow.models.shape import ModelShape

REPO = Path(__file__).resolve().parents[2]
README = REPO / "docs" / "pipeline" / "README.md"
HF_CONFIG = REPO / "sparrow" / "models" / "hf_configs" / "Qwen3-1.7B.json"
SCHEDULE = REPO / "conf" / "schedule" / "qwen3_1p7b_tau086.yaml"
BEGIN, END = "<!-- pipeline-simulation:begin -->", "<!-- pipeline-simulation:end -->"


@dataclass(frozen=True)
class Hardware:
    gpus: int = 8
    peak_flops: float = 989e12  # H200 dense bf16 FLOP/s (spec sheet)
    hbm_bytes_s: float = 4.8e12  # H200 HBM3e bytes/s (spec sheet)
    link_bytes_s: float = 450e9  # NVLink 4: 900 GB/s both directions, a broadcast uses one
    decode_efficiency: float = 0.7  # planned share of its roofline that decode reaches
    train_mfu: float = 0.4  # planned share of peak FLOP/s that the training passes reach


@dataclass(frozen=True)
class Workload:
    prompts: int = 32  # per step
    group_size: int = 8  # samples per prompt: 256 sequences, the GPU engine's max_batch_size
    prompt_tokens: int = 1024
    context_tokens: int = 32768  # every sequence decodes to the full 32K (the worst case)
    page_size: int = 16
    colocated_pool_pages: int = 24576  # the preset's KV pool beside the actor (12 x 32K)
    rollout_pool_pages: int = 65536  # a GPU without the actor (conf/rollout/gpu.yaml: 32 x 32K)
    dense_layers: int = 2  # the engine's always-dense layers 0 and 1
    forward_passes: int = 5  # log-probs 1 + update forward 1 + recompute 1 + backward 2

    @property
    def sequences(self) -> int:
        return self.prompts * self.group_size


@dataclass(frozen=True)
class Layout:
    name: str
    rollout_gpus: int
    train_gpus: int  # 0: colocated, the rollout GPUs train too
    rollout_s: tuple[float, float]  # dense, sparse
    train_s: float
    push_s: float

    def step_s(self, sparse: bool) -> float:
        return step_seconds(self.rollout_s[sparse], self.train_s, self.push_s, not self.train_gpus)


def step_seconds(rollout_s: float, train_s: float, push_s: float, colocated: bool) -> float:
    """Colocated synchronous: rollout, then training, on the same GPUs. One-step-off: the rollout
    of step t+1 runs while step t trains, so the slower side sets the pace, then the push."""
    if colocated:
        return rollout_s + train_s + push_s
    return max(rollout_s, train_s) + push_s


def weight_bytes(shape: ModelShape) -> int:
    """bf16 bytes of the weights a push moves (an untied LM head is a second vocab matrix)."""
    untied_head = 0 if shape.tied_embeddings else shape.vocab_size * shape.hidden_size
    return 2 * (weights_read(shape) + untied_head)


def train_flops(shape: ModelShape, work: Workload) -> float:
    """Dense FLOPs of the step's training passes: per forward-equivalent and sequence of S tokens,
    2 N S for the matrices and 2 L H_q D S^2 for causal attention (QK and PV, half the square)."""
    seq = work.context_tokens
    linear = 2 * weights_read(shape) * seq
    attention = 2 * shape.num_layers * shape.num_q_heads * shape.head_dim * seq * seq
    return float(work.sequences * work.forward_passes * (linear + attention))


@cache
def _wave_eflops(shape, work: Workload, batch: int, schedule, flops_per_byte: float) -> float:
    cost = CostConfig(work.page_size, flops_per_byte, num_dense_layers=work.dense_layers)
    out_tokens = work.context_tokens - work.prompt_tokens
    return decode_cost(shape, work.prompt_tokens, out_tokens, batch, schedule, cost).eflops


def rollout_seconds(shape, schedule, work: Workload, hw: Hardware, gpus: int, pool_pages: int):
    """(dense, sparse) seconds for `gpus` GPUs to decode the step's sequences: each decodes its
    share in waves of as many full-length rows as its pool holds."""
    per_gpu = -(-work.sequences // gpus)
    rows = pool_pages * work.page_size // work.context_tokens
    if rows < 1:
        raise ValueError(f"a pool of {pool_pages} pages holds no {work.context_tokens}-token row")
    waves = [rows] * (per_gpu // rows) + ([per_gpu % rows] if per_gpu % rows else [])
    flop_s, intensity = hw.peak_flops * hw.decode_efficiency, hw.peak_flops / hw.hbm_bytes_s
    return tuple(
        sum(_wave_eflops(shape, work, batch, arm, intensity) for batch in waves) / flop_s
        for arm in (None, schedule)
    )


def simulate(shape, schedule, work: Workload, hw: Hardware) -> list[Layout]:
    """Colocated synchronous on all GPUs, then one-step-off for every split R + T = gpus."""
    n, train_s = hw.gpus, train_flops(shape, work) / (hw.peak_flops * hw.train_mfu)
    pushed = weight_bytes(shape)
    # Colocated: each rank's engine copies its own actor's bf16 weights within its HBM.
    colo = rollout_seconds(shape, schedule, work, hw, n, work.colocated_pool_pages)
    layouts = [Layout(f"colocated, {n} GPUs", n, 0, colo, train_s / n, pushed / hw.hbm_bytes_s)]
    for r in range(1, n):
        rollout = rollout_seconds(shape, schedule, work, hw, r, work.rollout_pool_pages)
        push = pushed / hw.link_bytes_s
        layouts.append(Layout(f"R={r} T={n - r}", r, n - r, rollout, train_s / (n - r), push))
    return layouts


def kv_read_fraction(shape: ModelShape, schedule: BudgetSchedule, work: Workload) -> float:
    """K/V tokens the sparse decode reads over those a dense decode reads, all layers."""
    dense, sparse = work.dense_layers, shape.num_layers - work.dense_layers
    positions = range(work.prompt_tokens, work.context_tokens)  # the decoded tokens' contexts
    budget = [schedule.budget_pages(t) * work.page_size for t in positions]
    read = sum(dense * t + sparse * min(b, t) for t, b in zip(positions, budget, strict=True))
    return read / (shape.num_layers * sum(positions))


def _best(layouts: list[Layout], sparse: bool) -> Layout:
    return min(layouts[1:], key=lambda lay: lay.step_s(sparse))


def format_table(layouts: list[Layout]) -> str:
    """Seconds per step of every layout, and colocated's step over it per arm (best split bold)."""
    table = (
        "| layout | rollout dense | rollout sparse | train | push | step dense | step sparse "
        "| dense: colocated / step | sparse: colocated / step |\n" + "|---" * 9 + "|\n"
    )
    bests = [_best(layouts, sparse) for sparse in (False, True)]
    for lay in layouts:
        gains = [f"{layouts[0].step_s(s) / lay.step_s(s):.2f}x" for s in (False, True)]
        gains = [f"**{g}**" if lay is best else g for g, best in zip(gains, bests, strict=True)]
        table += (
            f"| {lay.name} | {lay.rollout_s[0]:.0f} | {lay.rollout_s[1]:.0f} | {lay.train_s:.0f} "
            f"| {lay.push_s:.3f} | {lay.step_s(False):.0f} | {lay.step_s(True):.0f} "
            f"| {gains[0]} | {gains[1]} |\n"
        )
    return table


def answer(layouts: list[Layout]) -> str:
    """Which split wins for each arm, by how much, and how sparse rollouts move it."""
    colocated, best = layouts[0], {s: _best(layouts, s) for s in (False, True)}
    lines = [
        f"{arm} rollouts: the best split is **R={lay.rollout_gpus} T={lay.train_gpus}**, "
        f"{lay.step_s(s):.0f} s a step against colocated's {colocated.step_s(s):.0f} s: "
        f"**{colocated.step_s(s) / lay.step_s(s):.2f}x**"
        for (s, lay), arm in zip(best.items(), ("dense", "sparse"), strict=True)
    ]
    dense, sparse = best[False], best[True]
    lines.append(
        f"sparse rollouts move the best split {dense.rollout_gpus - sparse.rollout_gpus} GPU(s) "
        f"from rollout to training (R={dense.rollout_gpus} -> R={sparse.rollout_gpus}); the best "
        f"sparse split's step is {dense.step_s(False) / sparse.step_s(True):.2f}x shorter than "
        f"the best dense split's and {colocated.step_s(False) / sparse.step_s(True):.2f}x "
        "shorter than colocated dense"
    )
    return "".join(f"- {line}\n" for line in lines)


def derived_inputs(shape: ModelShape, schedule: BudgetSchedule, work: Workload) -> str:
    """The figures the inputs give, computed so that the README cannot drift from them."""
    seq, n = work.context_tokens, weights_read(shape)
    attention = 2 * shape.num_layers * shape.num_q_heads * shape.head_dim * seq  # per token
    rows = [p * work.page_size // seq for p in (work.colocated_pool_pages, work.rollout_pool_pages)]
    items = [
        f"matrix parameters N (`weights_read`): {n / 1e9:.3f} B; weights pushed: "
        f"{weight_bytes(shape) / 1e9:.2f} GB (bf16)",
        f"K/V per token: {2 * shape.kv_dim * 2 * shape.num_layers // 1024} KiB (bf16, all "
        f"layers); {seq}-token rows a GPU's pool holds: {rows[0]} colocated, {rows[1]} "
        "rollout-only",
        f"training FLOPs per token of a {seq}-token row: {work.forward_passes} forward-"
        f"equivalents x {(2 * n + attention) / 1e9:.1f} G (attention "
        f"{attention / (2 * n + attention):.0%} of it)",
        "K/V tokens the tau 0.86 schedule reads over dense, all layers: "
        f"{kv_read_fraction(shape, schedule, work):.3f}",
    ]
    return "".join(f"- {item}\n" for item in items)


def format_block(shape, schedule, work: Workload, planned: Hardware) -> str:
    """What stands between the README's markers: the inputs and what they give, then the table and
    answer at the planned efficiencies and at the bare roofline (100% of both)."""
    inputs = [(f.name, getattr(o, f.name)) for o in (planned, work) for f in fields(o)]
    text = "| input | value |\n|---|---|\n" + "".join(f"| `{k}` | {v:,g} |\n" for k, v in inputs)
    text += "\n" + derived_inputs(shape, schedule, work)
    roofline = replace(planned, decode_efficiency=1.0, train_mfu=1.0)
    # Colocated's best case: a pool as large as a rollout-only GPU's (the actor would not fit).
    roomy = replace(work, colocated_pool_pages=work.rollout_pool_pages)
    for title, hw in (("Planned", planned), ("Roofline", roofline)):
        layouts = simulate(shape, schedule, work, hw)
        bound = simulate(shape, schedule, roomy, hw)[0]
        text += (
            f"\n**{title}**: decode at {hw.decode_efficiency:.0%} of its roofline, training at "
            f"{hw.train_mfu:.0%} MFU; seconds per step.\n\n{format_table(layouts)}\n"
            f"{answer(layouts)}- colocated's bound with a rollout-only GPU's pool "
            f"({work.rollout_pool_pages} pages beside the actor, which does not fit): "
            f"{bound.step_s(False):.0f} s dense, {bound.step_s(True):.0f} s sparse\n"
        )
    return text


def regenerate(
    readme: Path = README, work: Workload = Workload(), planned: Hardware = Hardware()
) -> str:
    """The README's text with what stands between its markers rewritten (not written)."""
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme}: markers {BEGIN} / {END} not found")
    before, rest = text.split(BEGIN, 1)
    shape = ModelShape.from_hf_config(SimpleNamespace(**json.loads(HF_CONFIG.read_text())))
    block = format_block(shape, build_schedule(load_schedule_config(SCHEDULE)), work, planned)
    return f"{before}{BEGIN}\n{block}{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    check, text = parser.parse_args(argv).check, regenerate()
    stale = README.read_text() != text
    if stale and check:
        print(f"stale: {README} (run python -m {__spec__.name})", file=sys.stderr)
        return 1
    if stale:
        README.write_text(text)
    print(f"rewrote {README}" if stale else "up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
