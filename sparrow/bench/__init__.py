"""Benchmarks run as `sparrow-bench <name>`: scripts that print a table and can write JSON.

cli.py               the dispatcher (COMMANDS)
actor.py             actor: share_prefix on vs off; peak RSS of an update vs the estimate
decode.py            decode: one decode step's launches, host syncs, page-table cost
kernel.py            kernel: sparse vs dense decode of one layer (time, bytes); --aot
kernel_aot.py        every Triton variant compiled ahead of time (regs, spills, smem)
kernel_configs.py    the kernel benchmark's shapes and tile sweep
prefix.py            prefix: generate with the shared prefix computed once vs not
rollout.py           rollout: engine vs HF generate; sparse vs dense decode and p5
step.py              step: one GRPO step with sparse and with dense rollouts
distill_attention.py DistillSparse's training-time attention: memory and time
dispatch_counter.py  what torch code launches and where it syncs, without a GPU
"""
