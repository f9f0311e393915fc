"""What a reward function returns and the timeout it may raise: the types shared by the reward
registry (`rewards.py`) and the rewards it registers (`math_verifier.py`), in a module of their
own so that neither imports the other."""

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class RewardResult:
    score: float  # the reward; 0.0 when the completion is wrong or unscorable
    extras: dict[str, Any] = field(default_factory=dict)  # per-sample values for logging


class RewardFn(Protocol):
    def __call__(self, prompt: str, completion: str, reference: str) -> RewardResult | float: ...


class RewardTimeout(TimeoutError):
    """Raised by a reward that enforces its own deadline (e.g. the math verifier's sandbox)."""
