"""`sparrow-eval`: score a saved policy on held-out prompts, without training.

    sparrow-eval runs/default                          # the run's policy on the run's evaluation
    sparrow-eval runs/default --samples 8 --temperature 0.6 --json
    sparrow-eval runs/x/policy --prompts test.jsonl --column question --limit 0

POLICY is a run dir (its exported `policy/`, written when sparrow-train finishes) or an exported
policy dir. The run's `run_config.json` beside the policy gives the data (source, system prompt,
chat template, columns), the reward and the evaluation settings, so by default this scores what
the run's last evaluation scored; without one, the schema's defaults (the embedded arithmetic
held-out split). Options override them; `--prompts FILE` scores every row of FILE. Prints one
line per metric: accuracy with its 95% CI, and with --samples k > 1 pass@j and mean@k with
theirs (sparrow/train/evaluation.py); --json prints them as one JSON object instead.
"""

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from sparrow.cli.config_loader import load_stored_config
from sparrow.cli.errors import ArgumentParser, UserError, at_least, one_line, run_main
from sparrow.distributed import Ranks
from sparrow.malloc import tune_cpu_allocator
from sparrow.models.loading import ADAPTER_BASE, load_model
from sparrow.rollout.engine import LLMEngine
from sparrow.tasks.data import DataError, PromptsTooLong, load_eval_prompts
from sparrow.tasks.environment import check_env_function
from sparrow.tasks.rewards import build_reward
from sparrow.train.config import SparrowConfig
from sparrow.train.evaluation import eval_sampling, evaluate
from sparrow.train.memory.context_budget import context_room
from sparrow.train.rollouts.episodes import Episodes
from sparrow.train.run.stored_config import FILE_NAME
from sparrow.train.step_report import RewardFailures


def main(argv: list[str] | None = None) -> int:
    return run_main("sparrow-eval", lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    args = _parse(argv)
    policy, stored = _find_policy(Path(args.policy))
    cfg = _config(args, policy, stored)
    torch.manual_seed(cfg.seed)
    tune_cpu_allocator()
    try:  # a bad reward or environment stops before the model loads
        reward = build_reward(cfg.rl.reward)
        check_env_function(cfg.env.function)
    except ValueError as err:  # e.g. the run's rl.reward.function file moved or deleted
        raise UserError(one_line(err)) from err
    try:
        lm = load_model(cfg.model)
    except ValueError as err:  # ModelUnreadable: the policy's weights missing or damaged
        again = " (running the run's sparrow-train command again exports it anew)" if stored else ""
        raise UserError(one_line(err) + again) from err
    if torch.cuda.is_available():
        # transformers wraps PreTrainedModel.to with functools.wraps, whose stub binds no self.
        lm.model.to("cuda")  # type: ignore[arg-type]
    room = context_room(cfg, lm.model.config)
    try:
        data = load_eval_prompts(cfg.data, cfg.rl.eval.split, lm.tokenizer, room.tokens)
    except PromptsTooLong as err:
        raise UserError(one_line(room.too_long(err))) from err
    except DataError as err:
        raise UserError(one_line(err)) from err  # it names the file, row or column
    ecfg = cfg.rl.eval
    prompts = data.prompts[: ecfg.num_prompts] if ecfg.num_prompts else data.prompts
    try:
        engine = LLMEngine(lm.model, lm.tokenizer, cfg.rollout.engine)
    except ValueError as err:  # a model family or window the engine does not run
        raise UserError(f"{policy}: {one_line(err)}") from err
    what = f" episodes of env.function={cfg.env.function}" if cfg.env.function else ""
    print(
        f"sparrow-eval: {policy} on {data.summary()}; scoring {len(prompts)}{what}", file=sys.stderr
    )
    params, sample_params = eval_sampling(ecfg.temperature, ecfg.max_new_tokens, ecfg.samples)
    # The run's environment (env.function): each sample is a multi-turn episode, pass@k over them.
    episodes = None
    if cfg.env.function:
        episodes = Episodes(cfg.env, lm.tokenizer, engine, ecfg.max_new_tokens)
    try:
        metrics, _ = evaluate(
            engine,
            reward,
            prompts,
            params,
            seed=cfg.seed,
            samples=ecfg.samples,
            sample_params=sample_params,
            episodes=episodes,
        )
    finally:
        if episodes is not None:
            episodes.close()  # the environments' worker (env.isolate) ends with the evaluation
    metrics.pop("eval/samples")
    RewardFailures(reward, Ranks(0, 1)).check_eval(metrics, "in this evaluation")
    if args.json:
        print(json.dumps({"policy": str(policy), "prompts": data.summary(), **metrics}))
    else:
        print("\n".join(metric_lines(metrics)))
    return 0


def metric_lines(metrics: dict) -> list[str]:
    """One line per scored metric: its value and 95% CI (accuracy first, as evaluate orders)."""
    n = int(metrics["eval/n"])
    return [
        f"{key.removeprefix('eval/')} {value:.3f} (95% CI {metrics[key + '_lo95']:.3f}-"
        f"{metrics[key + '_hi95']:.3f}, n={n})"
        for key, value in metrics.items()
        if key + "_lo95" in metrics
    ] + reward_failures_line(metrics)


def reward_failures_line(metrics: dict) -> list[str]:
    """The reward's failures, when it had any (each scored 0: a wrong answer to accuracy)."""
    if "eval/reward_calls" not in metrics:
        return []
    failed = metrics["eval/reward_errors"] + metrics["eval/reward_timeouts"]
    return [f"reward_errors {failed:.0f}/{metrics['eval/reward_calls']:.0f} (each scored 0)"]


def _find_policy(path: Path) -> tuple[Path, Path | None]:
    """The exported policy dir that `path` names, and the run config stored beside it if any."""
    if not path.is_dir():
        raise UserError(
            f"no policy at {path}: give a run dir (its policy/ is written when sparrow-train "
            "finishes) or an exported policy dir"
        )
    policy = path / "policy" if (path / FILE_NAME).is_file() or (path / "policy").is_dir() else path
    if (policy / ADAPTER_BASE).is_file():  # a LoRA run's policy/adapter/: the run dir above
        stored = policy.parent.parent / FILE_NAME
        return policy, stored if stored.is_file() else None
    if not (policy / "config.json").is_file():
        raise UserError(
            f"{policy} holds no exported policy (no config.json): sparrow-train writes "
            "run_dir/policy/ when it finishes; running the same command again resumes the run "
            "and exports it"
        )
    stored = policy.parent / FILE_NAME
    return policy, stored if stored.is_file() else None


def _config(args: argparse.Namespace, policy: Path, stored: Path | None) -> SparrowConfig:
    """The run's config (or the schema's) with the policy as the model and the options applied."""
    cfg = load_stored_config(stored) if stored else SparrowConfig()
    data = cfg.data
    if args.prompts == "tasks":
        data = replace(data, source="tasks", eval_source=None)
    elif args.prompts is not None:
        data = replace(data, eval_source=args.prompts)
    if args.column is not None:
        data = replace(data, prompt_column=args.column)
    if args.answer_column is not None:
        data = replace(data, answer_column=args.answer_column)
    chosen = {
        "num_prompts": args.limit,
        "samples": args.samples,
        "temperature": args.temperature,
        "max_new_tokens": args.max_tokens,
        "split": args.split,
    }
    try:
        evaluation = replace(cfg.rl.eval, **{k: v for k, v in chosen.items() if v is not None})
    except ValueError as err:  # EvalConfig's check names rl.eval.*; say which option it was
        raise UserError(f"{one_line(err)} (--samples, --temperature, --max-tokens)") from err
    model = replace(cfg.model, name=str(policy), dtype=args.dtype or cfg.model.dtype)
    seed = cfg.seed if args.seed is None else args.seed
    return replace(cfg, model=model, data=data, rl=replace(cfg.rl, eval=evaluation), seed=seed)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(prog="sparrow-eval", description=__doc__.split("\n")[0])
    p.add_argument("policy", help="a run dir (its policy/) or an exported policy dir")
    p.add_argument("--prompts", default=None, help='"tasks" (embedded) or a data file to score')
    p.add_argument("--split", default=None, help='"heldout"/"train" for tasks, a hub split')
    p.add_argument("--column", default=None, help="column holding the user message")
    p.add_argument("--answer-column", default=None, help="column holding the reference answer")
    p.add_argument("--limit", type=at_least(0), default=None, help="first N prompts (0: all)")
    p.add_argument("--samples", type=at_least(1), default=None, help="k samples per prompt")
    p.add_argument("--temperature", type=float, default=None, help="of the k samples")
    p.add_argument("--max-tokens", type=at_least(1), default=None, help="completion cap")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: the run's)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
