"""The GRPO loop and what runs around it; the one place that wires every component.

    trainer.py         GRPOTrainer: train_step (the phases) and fit (evaluation, checkpoints)
    policy_update.py   one GRPO/TIS update of theta: loss mask, no-signal skip, reference pass
    schedule_steering.py the controller's move, the engine's schedule, KV-read per step
    config.py          SparrowConfig: the dataclass tree conf/ is validated against
    step_report.py     rollout metrics, the plan line, the step and eval console lines
    dynamic_sampling.py DAPO's rounds of prompts until the ranks hold the groups with signal
    phase_timer.py     wall time per phase; the phases tile the step
    evaluation.py      held-out accuracy with a Wilson interval, paired to the first evaluation
    checkpoint.py      atomic, verified checkpoints; keep-last-N; resume lookup
    run_state.py       what a checkpoint holds besides the actor; resume
    run_config.py      the run dir's stored config and the resume-mismatch check
    run_lock.py        one live run per run dir (flock on run.lock)
    run_seeds.py       every random stream derived from the one `seed`
    run_history.py     metrics.jsonl cut back to the resumed step
    metrics_logger.py  metrics.jsonl, W&B (online, offline or off), histograms
    wandb_run.py       the W&B run's step axis and summaries
    tensorboard_log.py TensorBoard as a second logger
    panels.py          the dashboard's panels, one list for the PNGs and the W&B workspace
    weight_guard.py    non-finite weights and update streaks stop the run
    graceful_stop.py   SIGTERM/SIGINT: finish the step, checkpoint, exit
    interruption.py    signals outside the step loop (start-up, export): stop at once, one line
    policy_export.py   the final policy/ written through policy.tmp and a rename
    context_room.py    the tokens a prompt may take (KV pool, position limit) and the knob to name
    run_inputs.py      a run's prompts, then the memory plan they size, before any large allocation
    progress.py        the step line's elapsed time and ETA
    memory_plan.py     bytes per phase (weights, optimizer, engine pool, prefill, decode, actor)
    memory_fit.py      the plan against the device: size checkpointing/token budget, or refuse

Reductions over ranks come from sparrow/distributed.py.
"""
