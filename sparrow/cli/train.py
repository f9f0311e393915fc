"""`sparrow-train [key=value ...] [--cfg job]`: compose conf/ with Hydra overrides and train.

    sparrow-train                          # the embedded CPU default (SmolLM2, arithmetic task)
    sparrow-train preset=smoke             # 2 steps of a tiny random model
    sparrow-train preset=tiny --cfg job    # print the composed config and exit
    sparrow-train rl.steps=50 actor.lr=1e-6 schedule=qwen3_1p7b_tau086

Multi-node: scripts/launch_multinode.sh wraps torchrun around this module.

Bad input (config, data, a value a component rejects) ends with one line on stderr and exit code
2; a streak of non-finite updates (rl.max_nonfinite_streak) with one line and exit code 3.
"""

import logging
import sys

USAGE = __doc__


def main(argv: list[str] | None = None) -> int:
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
        print(f"sparrow-train: config error: {err}", file=sys.stderr)
        return 2

    from sparrow.malloc import tune_cpu_allocator
    from sparrow.tasks.data import DataError
    from sparrow.train.trainer import GRPOTrainer, NonFiniteStreak

    tune_cpu_allocator()

    try:
        trainer = GRPOTrainer(cfg)
    except (DataError, ValueError) as err:  # bad input found while loading model, data, parts
        print(f"sparrow-train: error: {_one_line(err)}", file=sys.stderr)
        return 2
    if cfg.dry_run:
        print(trainer.plan())
        print("dry run: model and data loaded, stopping before training")
        return 0
    try:
        trainer.fit()
    except NonFiniteStreak as err:
        print(f"sparrow-train: stopped: {_one_line(err)}", file=sys.stderr)
        return 3
    return 0


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


if __name__ == "__main__":
    sys.exit(main())
