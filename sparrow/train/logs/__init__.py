"""What a run reports: the metrics file, W&B, TensorBoard, the dashboard's panels, the ETA.

metrics_logger.py  metrics.jsonl, W&B (online, offline or off), histograms
wandb_run.py       the W&B run's step axis and summaries
tensorboard.py     TensorBoard as a second logger
panels.py          the dashboard's panels, one list for the PNGs and the W&B workspace
progress.py        the step line's elapsed time and ETA
"""
