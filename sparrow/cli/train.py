"""`sparrow-train [key=value ...] [--cfg job]`: compose conf/ with Hydra overrides and train.

    sparrow-train                          # the embedded CPU default (SmolLM2, arithmetic task)
    sparrow-train preset=smoke             # 2 steps of a tiny random model
    sparrow-train preset=tiny --cfg job    # print the composed config and exit
    sparrow-train rl.steps=50 actor.lr=1e-6 schedule=qwen3_1p7b_tau086

Multi-node: scripts/launch_multinode.sh wraps torchrun around this module.

Exit codes: 0 done; 2 bad input (config, data, model, reward or env function, paths, disk, a run dir
whose config or checkpoint does not match, or that holds files no sparrow run wrote), one line on
stderr naming the key or path, or a run dir that another live run holds (naming its host, pid and
start time); 3 training stopped on non-finite updates or weights, one line naming the last good
checkpoint; 4 a rank was lost (a collective failed: another rank died or did not answer within
actor.collective_timeout_min), one line saying how to resume; 128 + signal after SIGTERM/SIGINT,
once the step in flight is finished and checkpointed (a second signal exits at once; before the
first step and during the final export it stops at once). resume=auto (the default) continues
from the newest complete checkpoint.
"""

import logging
import os
import sys

from sparrow.cli.errors import (
    UserError,
    causes,
    model_not_found,
    one_line,
    run_main,
    stop_line,
)
from sparrow.train.run.stop_outside_loop import (
    STARTUP_ADVICE,
    Interrupted,
    ignore_stop_signals,
    stop_at_once,
)

USAGE = __doc__
LOST_RANK_EXIT = 4


def main(argv: list[str] | None = None) -> int:
    return run_main("sparrow-train", lambda: _train(argv))


def _train(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    print_cfg = None
    if "--cfg" in argv:
        i = argv.index("--cfg")
        print_cfg = argv[i + 1] if i + 1 < len(argv) else "job"
        del argv[i : i + 2]
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    from omegaconf import OmegaConf

    from sparrow.cli.config_loader import ConfigError, compose_dict, load_config

    try:
        if print_cfg is not None:
            print(OmegaConf.to_yaml(compose_dict(argv)), end="")
            return 0
        cfg = load_config(argv)
    except ConfigError as err:
        return stop_line(f"sparrow-train: config error: {err}", 2)
    _check_user_reward(cfg.rl.reward)
    _check_env_function(getattr(cfg, "env", None))

    from sparrow.train.run.lock import RunDirBusy, RunDirLock
    from sparrow.train.run.run_dir import RunDirRefused, check_run_dir

    # One run per run dir, locked before anything is written there; rank 0 holds it for all,
    # once the dir is one a run may write into (not another's files, a file or a checkout).
    lock = RunDirLock(cfg.run_dir)
    if int(os.environ.get("RANK", "0")) == 0:
        try:
            check_run_dir(cfg.run_dir, cfg.run_dir_reuse)
            lock.acquire()
        except (RunDirRefused, RunDirBusy) as err:
            raise UserError(one_line(err)) from err
    try:
        return _run_or_lost_rank(cfg, _pinned(argv))
    finally:
        lock.release()


def _check_user_reward(reward) -> None:
    """A reward function of the user's (rl.reward.function) that cannot be used stops here, in
    one line, before any model is loaded; an isolated one is checked in its own worker."""
    if not reward.function:
        return
    from sparrow.tasks.user_reward import RewardFunctionError, check_user_reward

    try:
        check_user_reward(
            reward.function, reward.kwargs, reward.batched, reward.isolate, reward.env_passthrough
        )
    except RewardFunctionError as err:
        raise UserError(one_line(err)) from err


def _check_env_function(env) -> None:
    """An environment of the user's (env.function) that cannot be used stops here, in one line,
    before any model is loaded; an isolated one is checked in its own worker."""
    if env is None or not env.function:
        return
    from sparrow.tasks.environment import EnvSpecError, check_env_function

    try:
        if env.isolate:
            from sparrow.tasks.env_guard import GuardedEnvFactory

            GuardedEnvFactory(env.function, isolate=True).close()
        else:
            check_env_function(env.function)
    except EnvSpecError as err:
        raise UserError(one_line(err)) from err


def _pinned(argv: list[str]) -> frozenset[str]:
    """The config keys set on the command line: the memory fit leaves them as set."""
    return frozenset(a.lstrip("+~").split("=", 1)[0] for a in argv if "=" in a)


def _check_family_and_context(cfg, config) -> str:
    """The config's family (model_type), or UserError in one line: a family sparrow does not run,
    or a prompt of data.max_prompt_tokens whose completion the model's positions cannot hold
    (the dry run plans for that sequence; a run would skip every such prompt)."""
    from sparrow.models.families import check_family
    from sparrow.train.memory.context_budget import context_room

    room = context_room(cfg, config)
    window = room.num_pages * room.page_size
    try:
        check_family(config, min(window, room.positions or window), "rollout.engine.num_pages")
    except ValueError as err:
        raise UserError(one_line(err)) from err
    sequence = cfg.data.max_prompt_tokens + room.completion_tokens
    if room.positions is not None and sequence > room.positions:
        raise UserError(
            f"data.max_prompt_tokens={cfg.data.max_prompt_tokens} + a {room.completion_tokens}-"
            f"token completion (rollout.max_new_tokens, rl.eval.max_new_tokens) = {sequence} "
            f"tokens, over {cfg.model.name}'s {room.positions} positions: lower them to a sum "
            f"of at most {room.positions}"
        )
    return config.model_type


def _dry_run_from_config(cfg, pinned: frozenset[str]) -> int | None:
    """A dry run of a model that is not on disk: the memory plan from its config alone (the HF
    cache's or a shipped one), per phase against the device; None when the model is on disk
    (the trainer then loads it and the data, and plans from both). Sizes as the run would."""
    from sparrow.models.model_config import read_model_config
    from sparrow.models.shape import ModelShape
    from sparrow.train.memory.fit import MemoryRefused, fit_memory, rank_device_memory
    from sparrow.train.memory.plan import targets_gpu

    try:
        config, source = read_model_config(cfg.model)
    except ValueError as err:
        raise UserError(one_line(err)) from err
    if not source.startswith("shipped"):
        return None
    family = _check_family_and_context(cfg, config)
    on_gpu = targets_gpu(cfg)
    device = rank_device_memory(cfg.memory, on_gpu)
    shape = ModelShape.from_hf_config(config)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    print(
        f"sparrow-train: dry run of {cfg.model.name} ({family}) from its config ({source}; no "
        f"weights or data loaded: prompts taken at data.max_prompt_tokens="
        f"{cfg.data.max_prompt_tokens}), {world} rank(s), ZeRO-{cfg.actor.zero_stage}"
    )
    try:
        fitted = fit_memory(cfg, shape, world, on_gpu, device, pinned)
    except MemoryRefused as err:
        print(err.plan.table(device.bytes, device.name))
        raise UserError(one_line(err)) from err
    print(fitted.plan.table(device.bytes, device.name))
    print(fitted.line())
    return 0


def _run_or_lost_rank(cfg, pinned: frozenset[str]) -> int:
    from sparrow.distributed import lost_peer
    from sparrow.malloc import tune_cpu_allocator

    tune_cpu_allocator()
    try:
        return _run(cfg, pinned)
    except (RuntimeError, Interrupted) as err:
        # torchrun SIGTERMs the other ranks right after one dies: that signal (or the
        # Interrupted it already raised on the way here) must not hide the cause.
        lost = next((e for e in causes(err) if lost_peer(e)), None)
        if lost is None:
            raise
        ignore_stop_signals()
        # The world's rank: with rollout ranks RANK and WORLD_SIZE are the role's (cluster.py).
        env = os.environ
        rank = env.get("SPARROW_WORLD_RANK", env.get("RANK", "0"))
        world = env.get("SPARROW_WORLD_SIZE", env.get("WORLD_SIZE", "1"))
        rank = f"rank {rank} of {world}"
        return stop_line(
            f"sparrow-train: {rank} stops: another rank was lost (a collective failed: "
            f"{one_line(lost)[:160]}); run the same command again on every rank: resume=auto "
            f"continues from the newest complete checkpoint in {cfg.run_dir}/checkpoints",
            LOST_RANK_EXIT,
        )


def _serve_rollouts(cfg, roles) -> int:
    """A rollout rank's run. A signal lets it serve on until the trainers, who got it too, have
    checkpointed and let it go; a lost trainer fails its next bridge collective (exit 4 above)."""
    import signal

    from sparrow.train.rollouts.rank import serve_rollout_rank
    from sparrow.train.run.stop_in_loop import GracefulStop

    with GracefulStop() as stop:
        try:
            serve_rollout_rank(cfg, roles)
        except ValueError as err:  # bad input found while loading the model or the reward
            raise UserError(one_line(err)) from err
    if stop.signum is None:
        return 0
    return stop_line(
        f"sparrow-train: rollout rank stopped by {signal.Signals(stop.signum).name} with the "
        "training ranks; run the same command again (resume=auto) to continue",
        128 + stop.signum,
    )


def _run(cfg, pinned: frozenset[str] = frozenset()) -> int:
    from sparrow.train.rollouts.rank import join_cluster
    from sparrow.train.run.stop_in_loop import StopRequested
    from sparrow.train.run.stored_config import ResumeMismatch
    from sparrow.train.run.weight_guard import NonFiniteStreak, NonFiniteWeights
    from sparrow.train.trainer import GRPOTrainer

    if cfg.dry_run:
        code = _dry_run_from_config(cfg, pinned)
        if code is not None:
            return code
    # A signal before the loop has no step to finish: stop at once (fit guards its own start).
    with stop_at_once("start-up", STARTUP_ADVICE):
        try:
            roles = join_cluster(cfg)  # rollout ranks apart: None without
        except ValueError as err:
            raise UserError(one_line(err)) from err
    if roles is not None and roles.role == "rollout":
        return _serve_rollouts(cfg, roles)
    with stop_at_once("start-up", STARTUP_ADVICE):
        try:
            trainer = GRPOTrainer.from_config(cfg, pinned=pinned, roles=roles)
        except OSError as err:
            model_not_found(err, "model.name", cfg.model.name)
            raise
        except ValueError as err:  # bad input found while loading model, data, parts
            raise UserError(one_line(err)) from err
    if cfg.dry_run:
        print(trainer.plan())
        memory = trainer.memory
        print(memory.plan.table(memory.device.bytes, memory.device.name))
        print("dry run: model and data loaded, stopping before training")
        return 0
    try:
        trainer.fit()
    except ResumeMismatch as err:
        raise UserError(one_line(err)) from err
    except (NonFiniteStreak, NonFiniteWeights) as err:
        return stop_line(f"sparrow-train: stopped: {one_line(err)}", 3)
    except StopRequested as stop:
        return stop_line(f"sparrow-train: {stop}", stop.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
