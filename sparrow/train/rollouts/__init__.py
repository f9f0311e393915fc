"""Where a step's rows come from: this rank's own draw, a thread one step ahead, or rollout ranks.

    source.py     RolloutSource: the trainer's one door to its rows (draw, measure, steer, push)
    draw.py       RolloutDraw: one step's rollouts and rewards on this rank's engine (no actor)
    episodes.py   Episodes: multi-turn episodes with their environments (env.function), rewards
    drawn.py      DrawnStep, what a producer hands over, and PendingStep, the one step in flight
    pipeline.py   RolloutPipeline: the asynchronous loop's producer, the next draw in a thread
    remote.py     RemoteRollouts: the same producer served by rollout ranks apart from the trainers
    rank.py       the world split into roles, and a rollout rank's run (cluster.rollout_ranks)

Direction: this room sits below the loop. It imports train's run/, logs/, config, memory/ and
the loop's helpers it draws with (build, dynamic_sampling, phase_timer, schedule_steering), never
the update side (trainer, policy_update, evaluation, step_report) nor the actor
(tests/test_layering.py holds it).
"""
