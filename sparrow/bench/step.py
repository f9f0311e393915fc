"""`sparrow-bench step`: one full GRPO step with sparse and with dense rollouts, side by side.

    sparrow-bench step --json runs/bench_step.json          # CPU default: preset=bench_step_cpu
    sparrow-bench step --warmup preset=tiny                  # any Hydra overrides after the flags
    sparrow-bench step --forwards '~preset'                  # make train's run: one forward vs two
    sparrow-bench step --random-model qwen3-1.7b --warmup preset=qwen3_1p7b_gpu \\
        rollout.max_new_tokens=16384                         # GPU: random Qwen3-1.7B shape

The trainer is built twice from the same composed config (conf/ + overrides, as sparrow-train
composes it; `preset=bench_step_cpu` unless a preset is given): once as configured (sparse) and
once with `schedule=dense`, same seed, hence the same prompts and sampler seeds. Each runs
`GRPOTrainer.train_step()` once (after an optional short warm-up step) and reports its phases:
rollout (generate + rewards), dense log-probs, monitor (acceptance, exact replay if
`monitor.exact`, controller), update, DistillSparse, weight sync: every `time/<phase>_s` the
trainer reports, in its order.

Both runs always time an actor update: the bench sets `rl.skip_no_signal=false` (unless
overridden), so a step whose groups all score alike (the 1 x 4 long-context group often does; a
random-weight model's rewards are all 0) still runs the update with zero advantages. Its cost is
the same as with a signal (the same forward, backward and optimizer step over the same tokens:
the advantages only scale the loss), and the rewards and the trainer stay as they are. The bench
exits with 1 when either run's update was still skipped or took no time.

The exact-acceptance replay is monitoring overhead the sparse policy needs; a dense-only trainer
has nothing to monitor, so by default the dense run sets `monitor.exact=false` (it still computes
the top-K bound, which costs next to nothing); `--dense-exact-monitor` makes it pay the replay
too. Both runs leave out the trainer's dense probes unless overridden (MEASURE_DEFAULTS: the
noise-floor share of prompts rolled out densely, the periodic timed dense re-rollout).

Speedups are throughput ratios (completion tokens per second), equal to time ratios when both
runs generate the same number of tokens (always with EOS ignored):
rollout_speedup = sparse rollout tok/s / dense rollout tok/s, step_speedup likewise over the
whole step, step_speedup_excl_monitor without the monitor phase of either run.

With `--forwards` the two runs are instead one dense forward against two, both as configured
(sparse): `one_forward` (rl.dense_pass=update: the update's forward gives the dense log-probs,
top-K and exact acceptance) and `two_forwards` (rl.dense_pass=separate: today's no-grad pass
before the update, and the monitor's own dense pass for the exact rows), same seed, same prompts.
`forward_ratio` = two_forwards step s / one_forward step s (> 1: one forward is faster), with the
per-phase seconds of both. The bench exits with 1 when an arm skipped its work: an update
skipped or untimed, the one-forward arm running a separate log-prob pass (it fell back), or the
two-forward arm timing none.
"""

import argparse
import cProfile
import gc
import math
import pstats
import resource
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from sparrow import malloc
from sparrow.bench.trainer_args import parse_with_overrides, trainer_parser, write_json
from sparrow.cli.errors import at_least

TIME_PREFIX, TIME_SUFFIX = "time/", "_s"  # the trainer's per-phase seconds: time/<phase>_s
FORWARD_ARMS = (("one_forward", "update"), ("two_forwards", "separate"))  # --forwards: dense_pass
ARM_LABELS = ("sparse", "dense", *(label for label, _ in FORWARD_ARMS))
DEFAULT_PRESET = "bench_step_cpu"
# Both runs, unless overridden: no dense share in the sparse rollout (noise-floor prompts) and no
# timed dense re-rollout, so the sparse run measures the sparse policy alone; and an update even
# when every advantage is zero (the step's update phase is what is timed, see above).
MEASURE_DEFAULTS = {
    "monitor.noise_floor_fraction": 0,
    "monitor.speedup_every": 0,
    "rl.skip_no_signal": "false",
}


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    from sparrow.cli.config_loader import ConfigError, load_config

    if args.random_model:
        overrides = _set(
            overrides, "model.name", str(_random_model_dir(args.random_model, args.device))
        )
    for key, value in MEASURE_DEFAULTS.items():
        if not any(_key(o) == key for o in overrides):
            overrides = [*overrides, f"{key}={value}"]
    runs = {
        "sparse": overrides,
        "dense": _set(_without(overrides, ("schedule.", "controller.")), "schedule", "dense")
        + ([] if args.dense_exact_monitor else ["monitor.exact=false"]),
    }
    if args.forwards:  # one dense forward against two, both sparse as configured
        runs = {label: _set(overrides, "rl.dense_pass", mode) for label, mode in FORWARD_ARMS}
    report: dict = {
        "config": {
            "argv": list(argv or []),
            "overrides": overrides,
            "cpu_allocator_tuned": malloc.tuned,
        }
    }
    with tempfile.TemporaryDirectory(prefix="sparrow-bench-step-") as tmp:
        for label, run_overrides in runs.items():
            forced = [f"run_dir={tmp}/{label}", "rl.eval.every=0", "logger.wandb.mode=disabled"]
            try:
                cfg = load_config([*run_overrides, *forced])
            except ConfigError as err:
                print(f"sparrow-bench step: config error: {err}", flush=True)
                return 2
            if label == "dense" and cfg.schedule.mode != "dense":
                raise AssertionError(f"the dense run composed schedule.mode={cfg.schedule.mode}")
            report[label] = run_step(cfg, args, label)
            write_json(args.json, report)  # partial results survive a later timeout
    if args.forwards:
        report |= forward_ratios(report["one_forward"], report["two_forwards"])
    else:
        report |= speedups(report["sparse"], report["dense"])
    report["problems"] = problems(report)
    print_table(report)
    write_json(args.json, report)
    for line in report["problems"]:
        print(f"sparrow-bench step: {line}", flush=True)
    return 1 if report["problems"] else 0


def problems(report: dict) -> list[str]:
    """Why the report does not measure a whole step (empty: it does): an update skipped or
    untimed in either run; with --forwards, a one-forward arm that ran a separate log-prob
    pass or a two-forward arm that timed none."""
    found = []
    labels = [label for label in ARM_LABELS if label in report]
    for label in labels:
        run = report[label]
        if run["update_skipped"]:
            found.append(f"the {label} run skipped its update (every advantage zero)")
        elif not run.get("update_s", 0) > 0:
            found.append(f"the {label} run timed no update (update_s {run.get('update_s')})")
    if "one_forward" in report and "logprobs" in report["one_forward"]["phases"]:
        found.append("the one_forward run ran a separate log-prob pass (rl.dense_pass fell back)")
    if "two_forwards" in report and not report["two_forwards"].get("logprobs_s", 0) > 0:
        found.append("the two_forwards run timed no separate log-prob pass")
    return found


def forward_ratios(one: dict, two: dict) -> dict:
    """Time ratios two forwards / one (> 1: one forward is faster), per step and per phase the
    arms share; the separate pass's and the monitor's seconds are given beside."""
    shared = [p for p in one["phases"] if p in two["phases"] and one[f"{p}_s"] > 0]
    return {
        "forward_ratio": two["step_s"] / one["step_s"],
        "forward_phase_ratios": {p: two[f"{p}_s"] / one[f"{p}_s"] for p in shared},
        "two_forwards_logprobs_s": two.get("logprobs_s"),
    }


def run_step(cfg, args, label: str) -> dict:
    """Build the trainer, run the optional warm-up step and one measured step; its summary."""
    from sparrow.train.trainer import GRPOTrainer

    print(f"\n== {label}: building the trainer ({cfg.model.name}, schedule {cfg.schedule.mode})")
    start = time.perf_counter()
    if args.ignore_eos or args.random_model:
        cfg = replace(cfg, rollout=replace(cfg.rollout, ignore_eos=True))
    trainer = GRPOTrainer.from_config(cfg)
    build_s = time.perf_counter() - start
    if trainer.engine.runner.device.type != args.device.type:
        raise AssertionError(
            f"the trainer built on {trainer.engine.runner.device}, not {args.device}"
        )
    if args.warmup:
        measured = trainer.draw.sampling
        trainer.draw.sampling = replace(
            measured, max_tokens=min(args.warmup_tokens, measured.max_tokens)
        )
        warm = trainer.train_step()
        trainer.draw.sampling = measured
        print(f"   warm-up step: {warm['time/step_s']:.1f} s")
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    on_gpu = trainer.engine.runner.device.type == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    metrics = trainer.train_step()
    if profiler is not None:
        profiler.disable()
        print(f"   profile of the {label} step (top {args.profile} by own time):")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
    summary = summarize(metrics, trainer.engine.last_stats)
    summary |= {
        "schedule": cfg.schedule.mode,
        "budgets_pages": list(cfg.schedule.budgets_pages) if cfg.schedule.mode != "dense" else [],
        "exact_monitor": cfg.monitor.exact,
        "build_s": build_s,
        "update_skipped": bool(metrics.get("update/no_signal")),
        "device": str(trainer.engine.runner.device),
        "distill": trainer.distill is not None,
        # The measured step's peak of allocated GPU memory (engine KV pool, actor, activations);
        # on a CPU the process's peak RSS so far (the build included).
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None,
        "process_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    print(
        f"   step {summary['step_s']:.1f} s, rollout {summary['rollout_s']:.1f} s, "
        f"{summary['completion_tokens']:.0f} tokens"
    )
    del trainer
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
    return summary


def summarize(metrics: dict, gen_stats) -> dict:
    """Phase seconds, token counts and rates, KV-read ratio, acceptance and the predicted speedup
    from one `train_step()`'s metrics and the rollout's `GenerateStats`."""
    phases = [
        k.removeprefix(TIME_PREFIX).removesuffix(TIME_SUFFIX)
        for k in metrics
        if k.startswith(TIME_PREFIX) and k.endswith(TIME_SUFFIX)
    ]  # in the step's order, "step" (the total) last
    out = {f"{p}_s": metrics[f"{TIME_PREFIX}{p}{TIME_SUFFIX}"] for p in phases}
    tokens = metrics["rollout/tokens"]
    out |= {
        "completion_tokens": tokens,
        "prompt_len_mean": metrics["len/prompt_mean"],
        "completion_len_mean": metrics["len/completion_mean"],
        "rollout_tok_s": tokens / out["rollout_s"],
        "step_tok_s": tokens / out["step_s"],
        "step_excl_monitor_s": out["step_s"] - out["monitor_s"],
        "prefill_s": gen_stats.prefill_s,
        "decode_s": gen_stats.decode_s,
        "decode_tok_s": gen_stats.decode_tok_s,
        "kv_read_ratio": metrics.get("kv_read_ratio"),
        "accept_p5_min": metrics.get("accept/p5_min"),
        "accept_topk_p5_min": metrics.get("accept_topk/p5_min"),
        "predicted_speedup": metrics.get("speedup/predicted"),
    }
    return {k: _finite_or_none(v) for k, v in out.items()} | {"phases": phases}


def speedups(sparse: dict, dense: dict) -> dict:
    """Throughput ratios sparse / dense (completion tokens per second)."""

    def per_token(run: dict, seconds: float) -> float:
        return run["completion_tokens"] / seconds

    return {
        "rollout_speedup": sparse["rollout_tok_s"] / dense["rollout_tok_s"],
        "step_speedup": sparse["step_tok_s"] / dense["step_tok_s"],
        "step_speedup_excl_monitor": per_token(sparse, sparse["step_excl_monitor_s"])
        / per_token(dense, dense["step_excl_monitor_s"]),
    }


def print_table(report: dict) -> None:
    first, second = ("one_forward", "two_forwards") if "one_forward" in report else ARM_LABELS[:2]
    sparse, dense = report[first], report[second]
    phases = [*dict.fromkeys([*sparse["phases"][:-1], *dense["phases"]])]  # both arms', in order
    # (label, report key, kind: "time", "rate" or None for a plain value)
    rows: list[tuple[str, str, str | None]] = [(f"{p} s", f"{p}_s", "time") for p in phases]
    rows += [
        ("step w/o monitor s", "step_excl_monitor_s", "time"),
        ("  prefill s (engine)", "prefill_s", "time"),
        ("  decode s (engine)", "decode_s", "time"),
        ("completion tokens", "completion_tokens", None),
        ("prompt tokens (mean)", "prompt_len_mean", None),
        ("rollout tok/s", "rollout_tok_s", "rate"),
        ("decode tok/s (engine)", "decode_tok_s", "rate"),
        ("step tok/s", "step_tok_s", "rate"),
        ("KV-read ratio", "kv_read_ratio", None),
        ("p5 acceptance (min bin)", "accept_p5_min", None),
        ("p5 top-K bound (min bin)", "accept_topk_p5_min", None),
        ("predicted speedup", "predicted_speedup", None),
    ]
    print(f"\n{'':26s}{first:>11s}{second:>11s}{'speedup':>10s}")
    for name, key, kind in rows:
        s, d = sparse.get(key), dense.get(key)
        ratio = ""
        if kind and s and d:
            ratio = f"{(d / s if kind == 'time' else s / d):9.2f}x"
        print(f"{name:26s}{_fmt(s):>11s}{_fmt(d):>11s}{ratio:>10s}")
    if first == "one_forward":
        print(f"\none dense forward per step: {report['forward_ratio']:.2f}x (step, two / one)")
        return
    print(
        f"\nrollout speedup {report['rollout_speedup']:.2f}x, step speedup "
        f"{report['step_speedup']:.2f}x ({report['step_speedup_excl_monitor']:.2f}x without the "
        f"monitor phase); dense run exact monitor: {dense['exact_monitor']}"
    )


def _random_model_dir(name: str, device: torch.device) -> Path:
    from sparrow.models.loading import cache_root
    from sparrow.models.random_init import save_random_model

    dtype = "bfloat16" if device.type == "cuda" else "float32"
    directory = cache_root() / "models" / f"random-{name}-{dtype}"
    print(f"random {name} weights ({dtype}) in {directory}", flush=True)
    return save_random_model(name, directory, dtype)


def _set(overrides: list[str], key: str, value: str) -> list[str]:
    """`overrides` with every assignment to `key` replaced by key=value (Hydra rejects two)."""
    return [o for o in overrides if _key(o) != key] + [f"{key}={value}"]


def _without(overrides: list[str], prefixes: tuple[str, ...]) -> list[str]:
    """`overrides` minus those under `prefixes` (a sparse run's schedule.mode=fixed would
    otherwise turn the dense run's schedule=dense back into a sparse one)."""
    return [o for o in overrides if not _key(o).startswith(prefixes)]


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _finite_or_none(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and abs(value) < 10:
        return f"{value:.3f}"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = trainer_parser("sparrow-bench step", __doc__)
    p.add_argument("--warmup", action="store_true", help="one short unmeasured step first")
    p.add_argument(
        "--warmup-tokens", type=at_least(1), default=16, help="new tokens of the warm-up step"
    )
    p.add_argument(
        "--ignore-eos", action="store_true", help="fixed-length rollouts (on with --random-model)"
    )
    p.add_argument(
        "--random-model",
        default=None,
        help="random weights of this shape (qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-debug)",
    )
    p.add_argument(
        "--dense-exact-monitor",
        action="store_true",
        help="the dense run pays the exact-acceptance replay too (default: top-K bound only)",
    )
    p.add_argument(
        "--forwards",
        action="store_true",
        help="one dense forward per step vs two (rl.dense_pass update vs separate), both sparse",
    )
    p.add_argument("--profile", type=at_least(0), default=0, help="cProfile each step: print top N")
    args, rest = parse_with_overrides(p, argv)
    if not any(_key(o) == "preset" for o in rest):
        rest = [f"preset={DEFAULT_PRESET}", *rest]
    return args, rest
