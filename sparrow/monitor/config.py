"""The monitor's knobs (conf/monitor/): how wide a position bin is, which estimator the controller
reads, and which rows of a step's rollout the monitor spends extra work on."""

from dataclasses import dataclass


@dataclass
class MonitorConfig:
    bin_tokens: int = 2000  # width of a position bin (absolute position, prompt + generated)
    top_k: int = 20  # K of the top-K bound; read by the engine and the actor that produce top-K
    exact: bool = False  # also compute exact full-vocabulary acceptance (the kept rollout logits)
    exact_fraction: float = 1.0  # share of sequences measured exactly (their T x V logits kept)
    noise_floor_fraction: float = 0.0  # share of prompts rolled out densely (dense vs dense)
    speedup_every: int = 0  # every N steps time a dense rollout of the same prompts; 0: never

    def __post_init__(self):
        if self.bin_tokens <= 0:
            raise ValueError(f"monitor.bin_tokens must be positive, got {self.bin_tokens}")
