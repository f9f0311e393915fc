"""Every random stream of a run, derived from its one `seed`.

Each stream's seed is `stream_seed(seed, stream, rank)`, a hash of the three: the streams of one
run are unrelated to each other, and a stream under another `seed` is unrelated to the same stream
under this one (an offset such as seed + 1 would replay seed 0's next sampling call). The streams:

    stream           drives                                          set explicitly by
    sampling         the engine's sampler on rank r; each training   rollout.engine.seed (then
                     rollout reseeds it with this + call index       rank r: seed + r * 2^20)
    data_order       the prompt iterator's per-epoch shuffle         data.shuffle_seed
    eval             held-out evaluation sampling, rank r, + step     -
    speedup          the timed dense re-rollout, rank r, + step       -
    distill_init     DistillSparse's LoRA init (every rank alike)     -
    distill_dropout  its LoRA dropout, rank r, + adapter step         -
    global           torch / python / numpy global generators         -

A component's own seed, when the config sets it, wins over the derived one and the plan line
says so. Evaluation and the speedup probe sample from their own streams, so turning them on or
off leaves the training rollouts' samples as they were. Not derived from `seed`: `model.seed`
(the tiny models' weights) and `data.tasks.seed` (which examples the task generator writes):
they choose what is trained on, and stay put when a study varies `seed`.
"""

import hashlib
import random
from dataclasses import dataclass

import numpy as np
import torch

from sparrow.distributed import rank_seed

_SEED_MASK = (1 << 31) - 1  # the CPU generator keeps 32 bits; call/step offsets stay below 2^32


def stream_seed(seed: int, stream: str, rank: int = 0) -> int:
    """The seed of random stream `stream` on `rank` under the run seed `seed` (a 31-bit hash)."""
    digest = hashlib.blake2b(f"{seed}/{stream}/{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _SEED_MASK


@dataclass(frozen=True)
class RunSeeds:
    seed: int  # the run's `seed`
    rank: int  # this process's data-parallel rank
    sampling: int  # the engine's seed on this rank
    data_order: int | None  # the prompt shuffle's seed; None keeps the source order
    explicit: tuple[str, ...]  # "key=value" of each component seed the config set, which won

    @property
    def global_rngs(self) -> int:
        return stream_seed(self.seed, "global")

    @property
    def distill_init(self) -> int:
        return stream_seed(self.seed, "distill_init")

    @property
    def distill_dropout(self) -> int:
        return stream_seed(self.seed, "distill_dropout", self.rank)

    def eval(self, step: int) -> int:
        return stream_seed(self.seed, "eval", self.rank) + step

    def speedup(self, step: int) -> int:
        return stream_seed(self.seed, "speedup", self.rank) + step

    def describe(self) -> str:
        """The plan line's account: which seed drives the streams, and which explicit one won."""
        line = f"seed {self.seed} derives every random stream"
        if self.explicit:
            line += f" but {', '.join(self.explicit)} (set explicitly, wins)"
        return line


def resolve_seeds(
    seed: int, engine_seed: int | None, shuffle: bool, shuffle_seed: int | None, rank: int
) -> RunSeeds:
    """The run's seeds on `rank`: each derived from `seed` unless the config set it (not None)."""
    explicit = []
    if engine_seed is None:
        sampling = stream_seed(seed, "sampling", rank)
    else:
        sampling = rank_seed(engine_seed, rank)
        explicit.append(f"rollout.engine.seed={engine_seed}")
    data_order = None
    if shuffle and shuffle_seed is None:
        data_order = stream_seed(seed, "data_order")
    elif shuffle:
        data_order = shuffle_seed
        explicit.append(f"data.shuffle_seed={shuffle_seed}")
    return RunSeeds(seed, rank, sampling, data_order, tuple(explicit))


def seed_global_rngs(seed: int) -> None:
    """Seed torch's (every device), python's and numpy's global generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
