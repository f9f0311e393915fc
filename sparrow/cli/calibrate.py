"""`sparrow-calibrate [options] [key=value ...]`: the cheapest schedule meeting tau, measured.

Rolls prompts of the configured task out at every budget of a grid, scores them exactly against
the dense policy, and writes per bin the cheapest budget whose p5 acceptance >= controller.tau:
OUT/schedule.yaml (a conf/schedule file: `sparrow-train schedule=... ` or copy it into
conf/schedule/), OUT/calibration.json (every bin x budget), OUT/p5_vs_position.png. With
`--online STEPS` it also runs the online controller's loop for STEPS steps on later prompts of the
same data, and prints both schedules side by side (OUT/online.json).

    sparrow-calibrate data=long_context schedule.bin_tokens=512 --budgets 4,8,16,32,64 \\
        --prompts 8 --online 6 --out runs/calibrate_long
Hydra overrides are those of sparrow-train (model, data, rollout, schedule, controller).
"""

import argparse
import json
import logging
import sys
from dataclasses import asdict, replace
from pathlib import Path

from sparrow.cli.errors import ArgumentParser, UserError, at_least, model_not_found, run_main

USAGE = __doc__


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = ArgumentParser(prog="sparrow-calibrate", usage=USAGE)
    parser.add_argument(
        "--budgets", type=_pages, help="comma-separated pages (default: schedule.grid_pages)"
    )
    parser.add_argument(
        "--prompts",
        type=at_least(0),
        default=8,
        help="prompts rolled out per budget (0: --online only)",
    )
    parser.add_argument(
        "--samples", type=at_least(1), default=2, help="samples per prompt and budget"
    )
    parser.add_argument("--min-tokens", type=at_least(1), help="default: controller.min_tokens")
    parser.add_argument(
        "--online", type=at_least(0), default=0, help="also run the online loop N steps"
    )
    parser.add_argument(
        "--online-prompts", type=at_least(1), default=4, help="prompts per online step"
    )
    parser.add_argument("--out", default="runs/calibrate", help="output directory")
    return parser.parse_known_args(argv)


def _pages(text: str) -> list[int]:
    """`--budgets 4,8,16` -> [4, 8, 16]; argparse names the option when this raises."""
    try:
        return [int(b) for b in text.split(",")]
    except ValueError:
        bad = next(b for b in text.split(",") if not b.strip().lstrip("-").isdigit())
        raise argparse.ArgumentTypeError(
            f"{bad!r} in {text!r} is not a whole number of pages (e.g. --budgets 4,8,16)"
        ) from None


def main(argv: list[str] | None = None) -> int:
    return run_main("sparrow-calibrate", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    args, overrides = parse_args(list(sys.argv[1:] if argv is None else argv))
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        raise UserError(f"unknown option {bad[0]} (see sparrow-calibrate --help)")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from sparrow.cli.config_loader import ConfigError, load_config
    from sparrow.malloc import tune_cpu_allocator

    tune_cpu_allocator()
    try:
        cfg = load_config(overrides)
    except ConfigError as err:
        print(f"sparrow-calibrate: config error: {err}", file=sys.stderr)
        return 2
    check_bounds(args, cfg.rollout.engine.num_pages)
    return run(cfg, args, args.budgets or list(cfg.schedule.grid_pages))


def check_bounds(args: argparse.Namespace, num_pages: int) -> None:
    """Refuse budgets outside the KV pool (the counts' bounds are their argparse types)."""
    budgets = args.budgets
    if budgets is not None and not 1 <= min(budgets) <= max(budgets) <= num_pages:
        raise UserError(
            f"--budgets {','.join(map(str, budgets))}: each budget must be between 1 page and "
            f"the KV pool (rollout.engine.num_pages={num_pages})"
        )
    if args.prompts == 0 and args.online < 1:
        raise UserError("--prompts 0 runs the online loop only: give --online STEPS")


def run(cfg, args, budgets: list[int]) -> int:
    from sparrow.rollout.engine import SamplingParams

    engine, data = load_engine_and_prompts(cfg, args)
    # Offline, one prompt is measured at every budget at once; online, at the schedule's.
    check_pool(data, max(len(budgets) * args.samples * (args.prompts > 0), args.samples), cfg)
    prompts = [p.token_ids for p in data.prompts]
    params = SamplingParams(
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        max_tokens=cfg.rollout.max_new_tokens,
    )
    tau, bin_tokens = cfg.controller.tau, cfg.schedule.bin_tokens
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"sparrow-calibrate: {cfg.model.name}, {data.summary()}; budgets {budgets} pages, "
        f"{args.prompts} prompts x {args.samples} samples each, tau {tau}, bins of {bin_tokens}"
    )

    offline = run_offline(engine, prompts[: args.prompts], budgets, params, cfg, args, out, data)

    if args.online:
        # The online loop takes the prompts the offline sweep did not see.
        run_online_beside(engine, prompts[args.prompts :], params, cfg, args, out, offline)
    return 0


def load_engine_and_prompts(cfg, args):
    """The engine over the configured model and the task's prompts, enough of them for the
    offline sweep and every online step (a one-line UserError otherwise)."""
    from sparrow.models.loading import load_model
    from sparrow.rollout.engine import LLMEngine
    from sparrow.tasks.data import load_prompts

    try:
        loaded = load_model(cfg.model)
    except OSError as err:
        model_not_found(err, "model.name", cfg.model.name)
        raise
    engine = LLMEngine(loaded.model, loaded.tokenizer, cfg.rollout.engine)
    try:
        data = load_prompts(cfg.data, loaded.tokenizer)
    except ValueError as err:
        raise UserError(str(err)) from err
    need = args.prompts + args.online * args.online_prompts
    if len(data.prompts) < need:
        raise UserError(
            f"--prompts {args.prompts} + --online {args.online} x --online-prompts "
            f"{args.online_prompts} need {need} prompts, {data.source} has {len(data.prompts)}"
        )
    return engine, data


def run_online_beside(engine, rest, params, cfg, args, out: Path, offline) -> None:
    """`--online STEPS`: the online controller's loop on `rest`, printed beside the offline
    schedule and written to OUT/online.json."""
    from sparrow.control.calibration import run_online
    from sparrow.control.controller import make_controller

    controller = make_controller(replace(cfg.schedule, mode="online"), cfg.controller)
    assert controller is not None, "an online schedule has a controller"
    batches = (rest[i : i + args.online_prompts] for i in range(0, len(rest), args.online_prompts))
    history = run_online(
        engine, controller, batches, args.online, args.samples, params, cfg.schedule.bin_tokens
    )
    print(format_online(history, cfg.controller.tau))
    final = list(controller.schedule.budgets_pages)
    print(f"offline: {offline}\nonline:  {final}")
    (out / "online.json").write_text(
        json.dumps(
            {
                "final_schedule_pages": final,
                "offline_schedule_pages": offline,
                "steps": [asdict(h) for h in history],
            },
            indent=1,
        )
    )


def check_pool(data, num_samples: int, cfg) -> None:
    """The KV pool must hold one prompt's whole measurement: `num_samples` rollouts, then each
    replayed densely and sparsely at once (engine.score keeps every sequence cached)."""
    from sparrow.control.calibration import pages_to_measure

    eng = cfg.rollout.engine
    longest = max(len(p.token_ids) for p in data.prompts)
    need = pages_to_measure(longest, cfg.rollout.max_new_tokens, num_samples, eng.page_size)
    if need > eng.num_pages:
        raise UserError(
            f"rollout.engine.num_pages={eng.num_pages} cannot hold one prompt's measurement: "
            f"{num_samples} samples (budgets x --samples) of the longest prompt ({longest} "
            f"tokens) + rollout.max_new_tokens={cfg.rollout.max_new_tokens}, replayed dense and "
            f"sparse, need {need} pages; raise rollout.engine.num_pages or lower --samples"
        )


def run_offline(engine, prompts, budgets, params, cfg, args, out: Path, data) -> list[int] | None:
    """The budget sweep and its cheapest schedule (None with --prompts 0)."""
    from sparrow.control.calibration import cheapest_schedule, sweep_budgets
    from sparrow.control.schedule import save_schedule_config

    if not prompts:
        return None
    tau, bin_tokens = cfg.controller.tau, cfg.schedule.bin_tokens
    min_tokens = args.min_tokens or cfg.controller.min_tokens
    sweep = sweep_budgets(engine, prompts, budgets, params, args.samples, bin_tokens)
    schedule, choices = cheapest_schedule(sweep, tau, min_tokens, cfg.schedule.grid_pages)
    stats = sweep.stats()
    print(format_sweep(stats, choices, budgets))
    sched_cfg = schedule.to_config("fixed")
    save_schedule_config(
        sched_cfg,
        out / "schedule.yaml",
        f"sparrow-calibrate: {cfg.model.name}, {data.source}, tau {tau}, "
        f"{args.prompts} prompts x {args.samples} samples per budget, min {min_tokens} tokens\n"
        f"budgets in pages of {cfg.rollout.engine.page_size} tokens (rollout.engine.page_size)",
    )
    result = {
        "tau": tau,
        "bin_tokens": bin_tokens,
        "budgets_pages": budgets,
        "schedule_pages": list(schedule.budgets_pages),
        "choices": [asdict(c) for c in choices],
        "kv_read_ratio": {b: s.kv_read_ratio for b, s in sweep.by_budget.items()},
        "bins": {b: [asdict(s) for s in st] for b, st in stats.items()},
    }
    (out / "calibration.json").write_text(json.dumps(result, indent=1))
    plot_sweep(stats, tau, out / "p5_vs_position.png")
    print(f"schedule {list(schedule.budgets_pages)} pages per bin -> {out / 'schedule.yaml'}")
    return list(schedule.budgets_pages)


def format_sweep(stats: dict, choices, budgets: list[int]) -> str:
    """bin | tokens at the first budget | p5 per budget | chosen budget and why."""
    budgets = sorted(set(budgets))
    head = "bin   positions      " + "".join(f"p5@{b:<6}" for b in budgets) + " chosen"
    lines = [head]
    by_bin = {b: {s.bin_index: s for s in stats[b]} for b in budgets}
    for c in choices:
        first = next((by_bin[b][c.bin_index] for b in budgets if c.bin_index in by_bin[b]), None)
        if first is None:
            continue
        cells = "".join(
            f"{by_bin[b][c.bin_index].p5:<9.3f}" if c.bin_index in by_bin[b] else f"{'-':<9}"
            for b in budgets
        )
        span = f"{first.start_token}-{first.end_token - 1}"
        lines.append(f"{c.bin_index:<5} {span:<14} {cells} {c.budget_pages} ({c.reason})")
    return "\n".join(lines)


def format_online(history, tau: float) -> str:
    lines = [f"online controller (tau {tau}): step | budgets per bin | p5 (tokens) per bin | KV"]
    for h in history:
        p5 = " ".join(f"b{s.bin_index}:{s.p5:.3f}({s.count})" for s in h.stats)
        lines.append(f"{h.step:>3} {list(h.budgets_pages)} {p5} kv {h.kv_read_ratio:.3f}")
    return "\n".join(lines)


def plot_sweep(stats: dict, tau: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for budget in sorted(stats):
        st = stats[budget]
        ax.plot([s.start_token for s in st], [s.p5 for s in st], "o-", label=f"{budget} pages")
    ax.axhline(tau, color="k", ls="--", lw=1, label=f"tau {tau}")
    ax.set_xlabel("position bin start (tokens)")
    ax.set_ylabel("p5 acceptance")
    ax.set_title("p5 acceptance vs position, per budget")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
