"""Studies behind the figures in the README's results table, as library modules run with
`python -m sparrow.experiments.<name>` (each prints its usage with --help):

- study: a study declared (`Study`: its arms, seeds, shared overrides, report) and `study_main`,
  every study's command (--status, --report, --background, overrides after `--`); study_runs:
  its runs as sparrow-train processes; study_files: what every study reads and writes (metrics
  rows, wall time, the metrics' copies under docs/, the README's table block); table_cells: the
  values and printed cells every study table is made of (means, 95% intervals, "-").
- stability_study: long GRPO runs at several tau (and dense, fixed-schedule, DistillSparse arms)
  side by side; writes docs/stability/ (stability_table.py: the table and overlay plots).
- parity_study: learning parity of sparse (tail rule) vs dense rollouts over seeds at the
  default run's size; writes docs/parity/ (parity_table.py).
- correction_study: rollout-correction modes and dynamic sampling at an aggressive fixed budget,
  against dense, over seeds; writes docs/correction/ (correction_table.py).
- speculative_study: speculative rollouts (sparse drafts, dense verifies) against dense on the
  default task over seeds, and the rollout time ratio per step; writes docs/speculative/
  (speculative_table.py).
- multi_turn_study: SmolLM2 on the Python tool task (env=python), sparse at tau 0.86 against
  dense over seeds: tool calls, turns, reward, held-out accuracy per step and the KV-read ratio
  per assistant turn; writes docs/multi_turn/ (multi_turn_table.py).
- distill_study: the DistillSparse study on the trainer (theta frozen, the online controller with
  and without the adapter, several seeds); distill_archive: what it keeps in docs/distill/runs
  (copies, settled budgets, tails); distill_tail: a finished run's held-out tail with and without
  its adapter, paired; distill_table: the report from docs/distill/runs (docs/distill/).
- default_run_report: the default run's table and the README's results row, from
  docs/default_run/metrics.jsonl (`--check`: are they current); default_run_spread: the
  committed runs of make train's config over seeds and hosts, and the claim a run on another
  host is held to.
- pipeline_simulation: a cost simulation (not a measurement) of the 8-H200 step of Qwen3-1.7B at
  32K, colocated against one-step-off R rollout + T training GPUs, dense and sparse; writes
  docs/pipeline/README.md's table (`--check`: is it current).
- pipeline_study: the staleness parity study, rl.async.staleness 1 vs 0 on the default task
  over seeds; writes docs/pipeline/README.md's study table (pipeline_table.py).
- task_accuracy: a model's accuracy on an embedded task and the task's prompt lengths.
- zero_signal_drift: how far AdamW moves the policy on steps whose advantages are all zero.

They sit above train and cli in the dependency direction (tests/test_layering.py) and own no
logic the trainer needs: the shared pieces (acceptance, KV-read ratio, schedules) are imported.
"""
