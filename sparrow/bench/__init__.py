"""Benchmarks run as `sparrow-bench <name>`: scripts that print a table and can write JSON.

cli.py               the dispatcher (COMMANDS)
device.py            the one device a bench builds on (CUDA when present), seeded there
actor.py             actor: share_prefix on vs off; peak memory of an update vs the estimate
decode_step.py       decode-step: one whole-model decode step, sparse vs dense (CUDA events)
decode_step_args.py  decode-step's arguments and their GPU / CPU defaults
decode_step_report.py decode-step's problems check and printed rows
decode_step_spec.py  decode-step's speculative arm: a dense verify pass of k + 1 positions timed
step_timer.py        the decode-step's timer: CUDA events or the wall clock, host share
decode.py            decode: one decode step's launches, host syncs, page-table cost
dense_shared.py      dense-shared: one prompt's samples, shared pages via the kernel vs copies
random_runner.py     a prefilled model runner over random weights of a real model's shapes
kernel.py            kernel: sparse vs dense decode of one layer (time, bytes); --aot
kernel_aot.py        every Triton variant compiled ahead of time (regs, spills, smem)
kernel_check.py      kernel-check: each decode-step Triton kernel against its torch reference
kernel_configs.py    the kernel benchmark's shapes and tile sweep
prefix.py            prefix: generate with the shared prefix computed once vs not
rollout.py           rollout: engine vs HF generate; sparse vs dense decode and p5
speculative.py       speculative: lossless speculative vs dense vs approximate sparse decode
step.py              step: one GRPO step with sparse and with dense rollouts
pipeline.py          pipeline: GRPO steps at staleness 0 vs 1 on one process, the overlap
layouts.py           pipeline --layouts: 1 rollout + 1 training rank vs 2 colocated ranks
trainer_args.py      the trainer benches' flags-then-overrides parser; every bench's JSON file
push.py              push: the weight push to a rollout rank per bucket size vs colocated sync
distill_attention.py DistillSparse's training-time attention: memory and time
cuda_splits.py       the split-KV count a GPU would choose, and its merge launch
dispatch_counter.py  what torch code launches and where it syncs, without a GPU
jit_compiles.py      Triton JIT compiles counted, so a bench shows none in a timed step
"""
