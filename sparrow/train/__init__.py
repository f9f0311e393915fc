"""The GRPO loop and what runs around it; the one place that wires every component.

    trainer.py         GRPOTrainer: train_step (the phases) and fit (evaluation, checkpoints)
    build.py           the run sized first (seeds, model, prompts, memory fit), then its parts
    policy_update.py   one GRPO/TIS update of theta: loss mask, no-signal skip, reference pass
    schedule_steering.py the controller's move, the engine's schedule, KV-read per step
    config.py          SparrowConfig: the dataclass tree conf/ is validated against
    step_report.py     rollout metrics, the plan line, the step and eval console lines
    dynamic_sampling.py `Rollout` (one round) and DAPO's rounds until the ranks hold signal groups
    rollout_draw.py    one step's rollouts and rewards on this rank's engine (no actor)
    rollout_source.py  where the step's rows come from: its own draw, or a producer one step ahead
    rollout_pipeline.py the asynchronous loop's rollout producer: the next step's draw in a thread
    remote_rollouts.py the same producer served by rollout ranks apart from the trainers
    rollout_rank.py    the world split into roles, and a rollout rank's run (cluster.rollout_ranks)
    phase_timer.py     wall time per phase; the phases tile the step
    evaluation.py      held-out accuracy with a Wilson interval, paired to the first evaluation
    run/               the run directory's lifecycle: checkpoints, run state, stored config,
                       history, lock, seeds, weight guard, signals, policy export
    memory/            the memory plan and its fit to the device, the context budget, run inputs
    logs/              metrics.jsonl, W&B, TensorBoard, the dashboard's panels, progress

Reductions over ranks come from sparrow/distributed.py.
"""
