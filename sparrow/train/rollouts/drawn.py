"""What a rollout producer hands the trainer (`DrawnStep`), and the bookkeeping both producers
share (`PendingStep`): at most one step submitted and not taken, its rows once they are in hand,
and the checkpoint's view of them."""

from dataclasses import dataclass

from sparrow.monitor.same_weights import SameWeightsDense
from sparrow.train.dynamic_sampling import Sampled


@dataclass
class DrawnStep:
    """One step's rollout as the producer hands it over."""

    step: int  # the 0-based step it is for
    sampled: Sampled  # the rounds, the trained groups, their rewards (kept logits freed)
    version: int  # the weight version that sampled every row (its rows' batch.weight_version)
    same_weights: SameWeightsDense  # the trained rows' monitored share, on their own weights
    times: dict[str, float]  # async/<phase>_s of the draw (rollout, rewards, ...)


class PendingStep:
    """The one step a producer has in flight or finished and not yet taken."""

    def __init__(self):
        self.step: int | None = None  # submitted and not taken
        self.done: DrawnStep | None = None  # its rows, once in hand

    def start(self, step: int) -> None:
        if self.step is not None:
            raise RuntimeError(f"step {self.step}'s rollout is still pending, not {step}'s")
        self.step = step

    def check(self, step: int) -> None:
        """`step` is the one pending (the trainer asks for the step it submitted)."""
        if self.step != step:
            raise RuntimeError(f"step {self.step}'s rollout is pending, step {step} asked")

    def take(self) -> DrawnStep:
        done, self.step, self.done = self.done, None, None
        assert done is not None, "a finished draw left its rows"
        return done

    def state_dict(self) -> dict | None:
        """The rows in hand, for a checkpoint: what a resumed run trains next (their prompts and
        sampling seed are spent)."""
        return None if self.done is None else {"drawn": self.done}

    def load_state_dict(self, state: dict | None) -> None:
        self.done = None if state is None else state["drawn"]
        self.step = None if self.done is None else self.done.step
