"""The sparsity control loop: the math of acceptance, schedules, control and cost (no ranks, no
trainer), and the offline calibration sweep that drives an engine it is given.

    acceptance.py   a_t = sum_v min(p, q): exact and top-K bound; position bins and percentiles
    schedule.py     BudgetSchedule: pages read per sparse layer, a step function of the position
    controller.py   the online controller (raise a bin below tau, lower one safely above) and
                    the fixed schedule
    throughput.py   the speculative-rollout controller: per-bin budgets and k for tokens/s
    calibration.py  the offline sweep behind sparrow-calibrate: p5 per bin at each budget
    cost_model.py   eFLOPs of dense vs block-sparse decode and of speculative rounds: the
                    predicted speedups
    kv_read.py      pages the sparse layers read over the pages a dense decode reads
    speculative_prediction.py  the cost model's speedup for the GPU check's speculative arm,
                    written to docs/gpu/ before a GPU runs it

The monitor (sparrow/monitor/) decides which tokens are measured and feeds the controller.
"""
