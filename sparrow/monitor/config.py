"""The monitor's knobs (conf/monitor/): which rows of a step's rollout the monitor spends extra
work on. Its bins are the schedule's (schedule.bin_tokens) and its top-K is the one the engine
records (rollout.engine.topk_logprobs): each knob is set in one place and passed down."""

from dataclasses import dataclass


@dataclass
class MonitorConfig:
    exact: bool = False  # also compute exact full-vocabulary acceptance (the kept rollout logits)
    exact_fraction: float = 1.0  # share of sequences measured exactly (their T x V logits kept)
    noise_floor_fraction: float = 0.0  # share of prompts rolled out densely (dense vs dense)
    speedup_every: int = 0  # every N steps time a dense rollout of the same prompts; 0: never
