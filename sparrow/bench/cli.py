"""`sparrow-bench <name> [args]`: dispatch to a benchmark module's `main(argv)`.

Modules are imported only when chosen, so one benchmark's heavy imports never slow another.
"""

import importlib
import sys

COMMANDS = {
    "decode": "sparrow.bench.decode",  # one decode step: launches per layer, host syncs, page table
    "kernel": "sparrow.bench.kernel",  # paged sparse vs dense decode: time, bytes, HBM fraction
    "rollout": "sparrow.bench.rollout",  # engine vs HF generate; sparse vs dense decode + p5
    "step": "sparrow.bench.step",  # one GRPO step, sparse vs dense rollouts: phases, speedups
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        names = ", ".join(sorted(COMMANDS))
        print(f"usage: sparrow-bench {{{names}}} [--help]", file=sys.stderr)
        return 2
    from sparrow.malloc import tune_cpu_allocator

    tune_cpu_allocator()  # before any benchmark allocates: both sides of a comparison get it
    module = importlib.import_module(COMMANDS[argv[0]])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
