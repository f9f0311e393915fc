"""DistillSparse's training-time sparse attention: peak memory and time of one adapter update,
page-gathering path (the training path) against the masked O(T^2) reference.

    sparrow-bench distill-attention --json runs/distill_attention.json
    sparrow-bench distill-attention --lengths 2048 4096 --repeats 5 --time-length 4096

The model is the tiny random Llama of the tests (4 layers, layers 0-1 dense, 4 query / 2 KV
heads of 16 dims, LoRA rank 16 on every linear layer); one rollout row of T tokens: a 64-token
prompt and T - 64 completion tokens, every one decoded with the same budget (--budget-tokens,
pages of 16). One measurement is one `DistillSparse.step` (sparse forward, backward, AdamW).

Memory: each (path, T) runs in its own subprocess, which builds the model and batch, resets the
peak, and reports it before and after the update; `step_mib` is the difference, the update's own
high-water mark above the idle process. On a CPU that is the peak RSS (Linux's VmHWM, reset
through /proc/self/clear_refs); on CUDA (where everything is built, `--device`) the peak of
allocated GPU memory.
Time: both paths in one process at --time-length, alternating, --repeats runs each after one
warm-up each; medians in seconds. Prints a table and writes JSON: `memory` (a row per path and
T), `growth` (per path, step_mib at the longest T over the shortest: ~T / T_min for O(T), its
square for O(T^2)), `gather_over_masked` (per T) and `time`. A path that fails keeps its row
with the error, goes into `problems`, and the bench exits with 1; a masked row skipped by
--masked-max-length is marked `skipped`.
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from sparrow.bench.device import bench_device, synchronize
from sparrow.train.memory.peaks import phase_peaks

PATHS = ("gather", "masked")
PROMPT_TOKENS = 64
PAGE_SIZE = 16


def _build(seq_len: int, budget_tokens: int, device: torch.device, seed: int = 0):
    """(DistillSparse, RolloutBatch, dense log-probs, advantages) for one row of seq_len tokens,
    on `device`."""
    import transformers

    from sparrow.distill import DistillConfig, DistillSparse
    from sparrow.models.loading import tiny_model_config
    from sparrow.rl.batch import RolloutBatch
    from sparrow.rollout.paged_attention import SparseAttentionConfig

    torch.manual_seed(seed)
    config = tiny_model_config("llama")
    config.max_position_embeddings = max(seq_len, config.max_position_embeddings)
    with torch.device(device):  # parameters made where they are used
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
    attn = SparseAttentionConfig(page_size=PAGE_SIZE)
    cfg = DistillConfig(enabled=True, micro_batch_size=1)
    distill = DistillSparse(cfg, model, attn, actor_lr=1e-4)
    ids = torch.randint(3, config.vocab_size, (1, seq_len), device=device)  # (1, T)
    positions = torch.arange(seq_len, device=device)  # (T,)
    completion = positions[None] >= PROMPT_TOKENS  # (1, T)
    pages = (positions + PAGE_SIZE - 1) // PAGE_SIZE  # context of token t, pages
    budget = torch.clamp(pages, max=budget_tokens // PAGE_SIZE)[None]  # (1, T)
    zeros = torch.zeros(1, seq_len, device=device)
    batch = RolloutBatch(
        input_ids=ids,
        attention_mask=torch.ones(1, seq_len, dtype=torch.bool, device=device),
        completion_mask=completion,
        prompt_lens=torch.tensor([PROMPT_TOKENS], device=device),
        sampled_logprobs=zeros,
        topk_ids=torch.zeros(1, seq_len, 1, dtype=torch.long, device=device),
        topk_logprobs=torch.zeros(1, seq_len, 1, device=device),
        budget_pages=torch.where(completion, budget, 0).int(),
        group_ids=torch.zeros(1, dtype=torch.long, device=device),
        finish_reasons=["length"],
    )
    dense_logprobs = torch.where(completion, -2.0, 0.0)  # (1, T) any fixed target
    advantages = completion.float()  # (1, T)
    return distill, batch, dense_logprobs, advantages


def _use(distill, path: str) -> None:
    from sparrow.distill.attention_reference import register_reference_attention
    from sparrow.distill.sparse_attention import register_attention

    name = register_attention() if path == "gather" else register_reference_attention()
    distill.policy.model.set_attn_implementation(name)


def _peak_mib(peaks) -> float:
    """The peak since `peaks.reset()` (memory/peaks.py: allocated GPU memory on CUDA, the RSS's
    VmHWM on Linux); without either, the process's whole-life ru_maxrss."""
    if peaks is not None:
        return peaks.read()[1] / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # bytes on macOS


def measure_memory(path: str, seq_len: int, budget_tokens: int, device: torch.device) -> dict:
    """In this (fresh) process: peak memory before and after one update on `path`."""
    distill, batch, dense, adv = _build(seq_len, budget_tokens, device)
    _use(distill, path)
    # From now: the update's high-water mark, not a higher one left by imports and the build
    # (at a few hundred tokens the update's is the lower).
    peaks = phase_peaks(device)
    if peaks is not None:
        peaks.reset()
    idle = _peak_mib(peaks)
    start = time.perf_counter()
    distill.step(batch, dense, adv, temperature=1.0)
    synchronize(device)
    seconds = time.perf_counter() - start
    peak = _peak_mib(peaks)
    return {
        "path": path,
        "seq_len": seq_len,
        "budget_tokens": budget_tokens,
        "idle_mib": round(idle, 1),
        "peak_mib": round(peak, 1),
        "step_mib": round(peak - idle, 1),
        "step_s": round(seconds, 3),
    }


def _memory_in_subprocess(
    path: str, seq_len: int, budget_tokens: int, device: torch.device, timeout: float
) -> dict:
    cmd = [sys.executable, "-m", "sparrow.bench.distill_attention", "--child", path, str(seq_len)]
    cmd += ["--budget-tokens", str(budget_tokens), "--device", str(device)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"path": path, "seq_len": seq_len, "error": f"rc {done.returncode}: {tail[0]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_time(seq_len: int, budget_tokens: int, repeats: int, device: torch.device) -> dict:
    """Both paths on one model, alternating: median seconds of one update each."""
    distill, batch, dense, adv = _build(seq_len, budget_tokens, device)
    seconds: dict[str, list[float]] = {path: [] for path in PATHS}
    for run in range(repeats + 1):  # run 0 warms up both
        for path in PATHS:
            _use(distill, path)
            synchronize(device)
            start = time.perf_counter()
            distill.step(batch, dense, adv, temperature=1.0)
            synchronize(device)
            if run > 0:
                seconds[path].append(time.perf_counter() - start)
    medians = {path: statistics.median(s) for path, s in seconds.items()}
    return {
        "seq_len": seq_len,
        "budget_tokens": budget_tokens,
        "repeats": repeats,
        "seconds": {path: [round(x, 3) for x in s] for path, s in seconds.items()},
        "median_s": {path: round(m, 3) for path, m in medians.items()},
        "masked_over_gather": round(medians["masked"] / medians["gather"], 2),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="sparrow-bench distill-attention", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--device", default=None, help="default: CUDA when present, else the CPU")
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    p.add_argument("--budget-tokens", type=int, default=512)
    p.add_argument("--masked-max-length", type=int, default=8192, help="skip masked beyond this")
    p.add_argument("--time-length", type=int, default=4096, help="0: skip the time comparison")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per memory subprocess")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--child", nargs=2, metavar=("PATH", "T"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.device = torch.device(args.device) if args.device else bench_device()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        path, seq_len = args.child
        print(json.dumps(measure_memory(path, int(seq_len), args.budget_tokens, args.device)))
        return 0
    memory = []
    what = "allocated GPU memory" if args.device.type == "cuda" else "RSS"
    print(f"peak {what} of one DistillSparse update, budget {args.budget_tokens} tokens (MiB)")
    print(f"{'path':>7} {'T':>6} {'idle':>8} {'peak':>8} {'step':>8} {'time_s':>7}")
    for seq_len in args.lengths:
        for path in PATHS:
            if path == "masked" and seq_len > args.masked_max_length:
                row = {"path": path, "seq_len": seq_len, "skipped": "--masked-max-length"}
            else:
                row = _memory_in_subprocess(
                    path, seq_len, args.budget_tokens, args.device, args.timeout
                )
            memory.append(row)
            if "step_mib" not in row:
                print(f"{path:>7} {seq_len:>6} {row.get('error') or 'skipped: ' + row['skipped']}")
            else:
                print(
                    f"{path:>7} {seq_len:>6} {row['idle_mib']:>8.0f} {row['peak_mib']:>8.0f} "
                    f"{row['step_mib']:>8.0f} {row['step_s']:>7.2f}"
                )
    result = {"device": str(args.device), "memory": memory, **memory_ratios(memory), "time": None}
    for path, growth in result["growth"].items():
        print(f"{path}: step memory x{growth} from T = {min(args.lengths)} to {max(args.lengths)}")
    for seq_len, ratio in result["gather_over_masked"].items():
        print(f"T = {seq_len}: gather / masked step memory = {ratio}")
    if args.time_length:
        timing = measure_time(args.time_length, args.budget_tokens, args.repeats, args.device)
        result["time"] = timing
        print(f"time of one update at T = {args.time_length}, medians of {args.repeats} (s):")
        for path in PATHS:
            print(f"{path:>7} {timing['median_s'][path]:>8.3f}  runs {timing['seconds'][path]}")
        print(f"masked / gather = {timing['masked_over_gather']}")
    result["problems"] = [
        f"{row['path']} at T = {row['seq_len']}: {row['error']}" for row in memory if "error" in row
    ]
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    for line in result["problems"]:
        print(f"sparrow-bench distill-attention: {line}", file=sys.stderr)
    return 1 if result["problems"] else 0


def memory_ratios(memory: list[dict]) -> dict:
    """`growth`: per path, step_mib at its longest measured T over its shortest; and
    `gather_over_masked`: per T where both ran, gather's step_mib over masked's."""
    step = {(r["path"], r["seq_len"]): r["step_mib"] for r in memory if "step_mib" in r}

    def ratio(num: float, den: float) -> float | None:  # None: no growth to compare against
        return round(num / den, 2) if den > 0 else None

    growth = {}
    for path in PATHS:
        lengths = sorted(t for p, t in step if p == path)
        if len(lengths) > 1:
            growth[path] = ratio(step[path, lengths[-1]], step[path, lengths[0]])
    both = sorted(t for p, t in step if p == "gather" and ("masked", t) in step)
    over = {str(t): ratio(step["gather", t], step["masked", t]) for t in both}
    return {"growth": growth, "gather_over_masked": over}


if __name__ == "__main__":
    raise SystemExit(main())
