"""The GRPO loop and what runs around it; the one place that wires every component.

    trainer.py         GRPOTrainer: train_step (the phases) and fit (evaluation, checkpoints)
    build.py           the run sized first (seeds, model, prompts, memory fit), then its parts
    policy_update.py   one GRPO/TIS update of theta: loss mask, no-signal skip, reference pass
    schedule_steering.py the controller's move, the engine's schedule, KV-read per step
    config.py          SparrowConfig: the dataclass tree conf/ is validated against
    step_report.py     rollout metrics, the plan line, the step and eval console lines
    dynamic_sampling.py `Rollout` (one round) and DAPO's rounds until the ranks hold signal groups
    phase_timer.py     wall time per phase; the phases tile the step
    evaluation.py      held-out accuracy with a Wilson interval, paired to the first evaluation
    rollouts/          where a step's rows come from: its own draw, a thread one step ahead, or
                       rollout ranks (the producers, and a rollout rank's run)
    run/               the run directory's lifecycle: checkpoints, run state, stored config,
                       history, lock, seeds, weight guard, signals, policy export
    memory/            the memory plan and its fit to the device, the context budget, run inputs
    logs/              metrics.jsonl, W&B, TensorBoard, the dashboard's panels, progress

Reductions over ranks come from sparrow/distributed.py.
"""
