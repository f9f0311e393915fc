"""The GRPO loop and what runs around it; the one place that wires every component.

    trainer.py         GRPOTrainer: train_step (the phases) and fit (evaluation, checkpoints)
    config.py          SparrowConfig: the dataclass tree conf/ is validated against
    step_report.py     rollout metrics, the plan line, the step and eval console lines
    phase_timer.py     wall time per phase; the phases tile the step
    evaluation.py      held-out accuracy with a Wilson interval, paired to the first evaluation
    checkpoint.py      atomic, verified checkpoints; keep-last-N; resume lookup
    run_state.py       what a checkpoint holds besides the actor; resume
    run_config.py      the run dir's stored config and the resume-mismatch check
    run_lock.py        one live run per run dir (flock on run.lock)
    run_seeds.py       every random stream derived from the one `seed`
    run_history.py     metrics.jsonl cut back to the resumed step
    metrics_logger.py  metrics.jsonl, W&B (online, offline or off), histograms
    weight_guard.py    non-finite weights and update streaks stop the run
    graceful_stop.py   SIGTERM/SIGINT: finish the step, checkpoint, exit
    progress.py        the step line's elapsed time and ETA
    memory_plan.py     bytes per phase (weights, optimizer, engine pool, prefill, decode, actor)
    memory_fit.py      the plan against the device: size checkpointing/token budget, or refuse

Reductions over ranks come from sparrow/distributed.py.
"""
