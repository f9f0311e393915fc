"""How many prompt tokens a run leaves room for, and which key to raise when no prompt fits.

A prompt must fit the engine's KV pool (`rollout.engine.num_pages` x `page_size` tokens) and the
model's positions together with the longest completion (training or evaluation); prompts over
the room are skipped and counted by the loader. When every prompt is over it, the one line names
the knob that sets the room and, for the pool, the value that would let the shortest prompt in;
a prompt over the model's positions is to be shortened or dropped (no pool holds it).
"""

from dataclasses import dataclass

from sparrow.tasks.data import PromptsTooLong
from sparrow.train.config import SparrowConfig

_COMPLETION_KEYS = "rollout.max_new_tokens, rl.eval.max_new_tokens"


@dataclass(frozen=True)
class ContextRoom:
    completion_tokens: int  # the longest completion: training's or evaluation's
    num_pages: int  # rollout.engine.num_pages
    page_size: int  # rollout.engine.page_size
    positions: int | None  # the model's max_position_embeddings; None when it has none

    @property
    def tokens(self) -> int:
        """What a prompt may use: the smaller window minus the completion."""
        window = self.num_pages * self.page_size
        return min(window, self.positions or window) - self.completion_tokens

    def too_long(self, err: PromptsTooLong) -> ValueError:
        """The error for data none of whose prompts fits, naming the key that sets the room; it
        never advises a pool past the model's positions."""
        if self.tokens >= err.shortest_tokens:  # data.max_prompt_tokens binds: err names it
            return ValueError(str(err))
        completion = f"a {self.completion_tokens}-token completion ({_COMPLETION_KEYS})"
        shortest = f"the shortest prompt has {err.shortest_tokens} tokens"
        if self.positions is not None and err.shortest_tokens >= self.positions:
            room = max(self.positions - self.completion_tokens, 0)
            return ValueError(
                f"{shortest}, over the model's {self.positions} positions, which no KV pool "
                f"extends: shorten the prompts or drop those rows (with {completion} a prompt "
                f"may have {room} tokens)"
            )
        if self.positions is not None and (
            err.shortest_tokens + self.completion_tokens > self.positions
        ):
            return ValueError(
                f"the model's {self.positions} positions hold no prompt with {completion}: "
                f"{shortest}; lower {_COMPLETION_KEYS} to at most "
                f"{self.positions - err.shortest_tokens} or shorten the prompts"
            )
        pages = -(-(err.shortest_tokens + self.completion_tokens) // self.page_size)
        return ValueError(
            f"rollout.engine.num_pages={self.num_pages} ({self.num_pages * self.page_size} "
            f"tokens) holds no prompt with {completion}: {shortest}; raise "
            f"rollout.engine.num_pages to at least {pages}"
        )


def context_room(cfg: SparrowConfig, model_config) -> ContextRoom:
    eng = cfg.rollout.engine
    return ContextRoom(
        completion_tokens=max(cfg.rollout.max_new_tokens, cfg.rl.eval.max_new_tokens),
        num_pages=eng.num_pages,
        page_size=eng.page_size,
        positions=getattr(model_config, "max_position_embeddings", None),
    )
