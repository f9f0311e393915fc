"""The run directory's lifecycle: what a run leaves on disk and how a later launch picks it up.

state.py             RunState: what a checkpoint holds besides the actor; save and resume
checkpoint.py        atomic, verified checkpoints; keep-last-N; resume lookup
stored_config.py     the run dir's stored config and the resume-mismatch check
host.py              host.json: the CPU and libraries whose kernels a run's float results depend on
history.py           metrics.jsonl made durable row by row, cut back to the resumed step
lock.py              one live run per run dir (flock on run.lock)
run_dir.py           a run dir a run may write into: none of another's files, no file, no checkout
seeds.py             every random stream derived from the one `seed`
weight_guard.py      non-finite weights and update streaks stop the run
stop_in_loop.py      SIGTERM/SIGINT inside the step loop: finish the step, checkpoint, exit
stop_outside_loop.py signals outside the step loop (start-up, export): stop at once, one line
policy_export.py     the final policy/ written through policy.tmp and a rename
"""
