"""`sparrow-bench <name> [args]`: dispatch to a benchmark module's `main(argv)`.

    sparrow-bench actor [--help]              the dense actor: share_prefix on vs off, update RSS
    sparrow-bench decode-step [--help]        whole-model decode step, sparse vs dense: time
    sparrow-bench decode [--help]             one decode step's launches, syncs, page table
    sparrow-bench dense-shared [--help]       dense decode of one prompt's samples: kernel vs copies
    sparrow-bench distill-attention [--help]  DistillSparse's sparse attention: memory, time
    sparrow-bench kernel [--help]             paged sparse vs dense decode: time, bytes, HBM
    sparrow-bench kernel-check [--help]       each decode-step Triton kernel against torch
    sparrow-bench pipeline [--help]           GRPO steps at staleness 0 vs 1: overlap, ratio
    sparrow-bench prefix [--help]             few-shot prompts, shared prefix on vs off
    sparrow-bench push [--help]               weight push to a rollout rank vs colocated sync
    sparrow-bench rollout [--help]            engine vs HF generate; sparse vs dense decode, p5
    sparrow-bench speculative [--help]        lossless speculative vs dense vs sparse decode
    sparrow-bench step [--help]               one GRPO step, sparse vs dense rollouts: phases

Every subcommand builds on the device it finds (CUDA when present, else the CPU; `--device`).

Modules are imported only when chosen, so one benchmark's heavy imports never slow another.
Bad input ends with one line and exit code 2 (sparrow.cli.errors).
"""

import importlib
import sys

from sparrow.cli.errors import run_main

COMMANDS = {
    "actor": "sparrow.bench.actor",  # the dense actor: share_prefix on vs off, RSS of an update
    "decode-step": "sparrow.bench.decode_step",  # whole-model decode step, sparse vs dense: time
    "decode": "sparrow.bench.decode",  # one decode step: launches per layer, host syncs, page table
    "dense-shared": "sparrow.bench.dense_shared",  # one prompt's samples: shared pages vs copies
    "distill-attention": "sparrow.bench.distill_attention",  # DistillSparse attention: memory, time
    "kernel": "sparrow.bench.kernel",  # paged sparse vs dense decode: time, bytes, HBM fraction
    "kernel-check": "sparrow.bench.kernel_check",  # each decode-step kernel against its reference
    "pipeline": "sparrow.bench.pipeline",  # GRPO steps at staleness 0 vs 1: overlap, step ratio
    "prefix": "sparrow.bench.prefix",  # generate on few-shot prompts, shared prefix on vs off
    "push": "sparrow.bench.push",  # the weight push per bucket size vs the colocated sync
    "rollout": "sparrow.bench.rollout",  # engine vs HF generate; sparse vs dense decode + p5
    "speculative": "sparrow.bench.speculative",  # lossless speculative vs dense vs sparse decode
    "step": "sparrow.bench.step",  # one GRPO step, sparse vs dense rollouts: phases, speedups
}


def main(argv: list[str] | None = None) -> int:
    return run_main("sparrow-bench", lambda: _dispatch(sys.argv[1:] if argv is None else argv))


def _dispatch(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[1])
        return 0
    if not argv or argv[0] not in COMMANDS:
        names = ", ".join(sorted(COMMANDS))
        print(f"usage: sparrow-bench {{{names}}} [--help]  (sparrow-bench --help)", file=sys.stderr)
        return 2
    from sparrow.malloc import tune_cpu_allocator

    tune_cpu_allocator()  # before any benchmark allocates: both sides of a comparison get it
    module = importlib.import_module(COMMANDS[argv[0]])
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
