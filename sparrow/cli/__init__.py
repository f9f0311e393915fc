"""The console entry points; Hydra lives only here (config_loader.py turns conf/ into dataclasses).

train.py          sparrow-train
generate.py       sparrow-generate
calibrate.py      sparrow-calibrate
report.py         sparrow-report
config_loader.py  Hydra composition with one-line errors
errors.py         the error boundary every console script shares (user errors: one line)
"""
