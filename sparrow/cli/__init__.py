"""The console entry points; Hydra lives only here (config_loader.py turns conf/ into dataclasses).

train.py          sparrow-train
generate.py       sparrow-generate
eval_policy.py    sparrow-eval: a saved policy scored (accuracy, pass@j, mean@k) without training
calibrate.py      sparrow-calibrate
report.py         sparrow-report: the panels as PNGs, or as a W&B workspace
report_runs.py    the run directories a report reads
panel_drawing.py  one panel drawn with matplotlib
wandb_workspace.py the panels as a wandb-workspaces workspace
config_loader.py  Hydra composition with one-line errors
moved_keys.py     config keys that moved, and the one line naming where each is set now
errors.py         the error boundary every console script shares (user errors: one line)
option_tables.py  the option tables of docs/guide/, generated from the config dataclasses
device_table.py   the README's preset x device table, from the memory plans
launcher.py       torchrun's agent for scripts/launch_multinode.sh: a failed run ends with
                  sparrow's line and exit code
"""
