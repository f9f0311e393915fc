"""The engine's sleep: its memory handed back between a rollout and the next, while the actor
trains on the same device (verl's free_cache_engine, vLLM's sleep mode).

    engine.sleep("kv")       # the KV pool, page summaries, dense copies and decode graphs freed
    engine.sleep("weights")  # ... and the weight copy (its packed copies too)
    engine.wake()            # re-allocated; a released weight copy must be pushed again

Levels (rollout.engine.sleep): `off` never sleeps; `kv` frees the cache, which is rebuilt empty
on wake (the same state as a new engine's: generations are bit-equal to never sleeping);
`weights` also frees the weight copy's storage in place (the tensors and their views stay, with
no bytes), re-allocated on wake and filled by the next `update_weights` (the trainer's weight
sync), which must then hold every weight.

CUDA graphs are re-captured after wake, not kept valid at fixed addresses: a graph replays raw
pointers to the pool, the weights and its own private memory pool, and torch's caching allocator
promises no address for a re-allocation (vLLM keeps addresses with a cuMem-mapped allocator of
its own, a C extension sparrow does not carry). Dropping the graphs also frees their private
pool; re-capturing costs one capture per step shape (a handful per rollout, docs/DESIGN.md).
On CPU the freed blocks go back to the OS: the pool is one mmapped block per tensor (above
glibc's mmap threshold, sparrow.malloc) and the heap's free top is trimmed (`trim_heap`).
"""

from collections.abc import Iterable

import torch
from torch import Tensor

from sparrow.malloc import trim_heap

LEVELS = ("off", "kv", "weights")


def check_level(level: str) -> str:
    if level not in LEVELS:
        raise ValueError(f"rollout.engine.sleep={level!r}: expected one of {', '.join(LEVELS)}")
    return level


def release_storages(tensors: Iterable[Tensor]) -> list[tuple[torch.UntypedStorage, int]]:
    """Free the storage of each tensor (views share one: freed once) and return (storage, bytes)
    to restore. The tensors keep their shapes and must not be read until `restore_storages`."""
    held: dict[int, tuple[torch.UntypedStorage, int]] = {}
    for t in tensors:
        storage = t.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in held:
            held[storage.data_ptr()] = (storage, storage.nbytes())
    for storage, _ in held.values():
        storage.resize_(0)
    return list(held.values())


def restore_storages(released: list[tuple[torch.UntypedStorage, int]]) -> None:
    """Re-allocate what `release_storages` freed (uninitialised: the caller fills it)."""
    for storage, nbytes in released:
        storage.resize_(nbytes)


def return_memory(device: torch.device) -> None:
    """Hand freed memory back: the CUDA caching allocator's cached blocks to the driver (the
    actor allocates through the same allocator, but a 40 GB pool freed as one segment would
    otherwise stay carved for it), or on CPU glibc's free heap top to the kernel."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        trim_heap()
