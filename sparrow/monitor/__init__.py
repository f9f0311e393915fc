"""The monitor: how far the sparse rollout policy is from the dense policy, on each step's tokens.
The trainer calls one object, `monitor.Monitor` (docs/DESIGN.md §2 and §4).

    monitor.py             Monitor: plan() before the rollout, measure() after the log-probs
    config.py              MonitorConfig (conf/monitor/)
    rollout_plan.py        which rows decode densely (noise floor) and which keep their logits
    exact_acceptance.py    full-vocabulary acceptance from the kept logits (or a replay)
    same_weights.py        asynchronous rollout: the dense side from the weights that sampled
                           the rows (the engine's dense replay), never the trainer's newer ones
    acceptance_metrics.py  exact and top-K acceptance binned over all ranks: metrics and the
                           controller's per-bin stats
    mismatch.py            the peers' rollout-vs-dense metrics: k1/k3 KL per bin, perplexity
                           ratio, extreme token ratios
    speedup_probe.py       every few steps, the same prompts rolled out densely and timed
    draft_acceptance.py    speculative rollouts: the drafts' acceptance per bin (and budget),
                           tokens per verify pass, the draft/verify time split
"""
