"""Activation checkpointing of the decoder layers that also holds with a KV cache.

HF's own gradient checkpointing only acts in training mode (the actor runs in eval mode, so that
the PPO ratio is exactly 1 at a step's start) and drops the KV cache, which the shared-prompt pass
needs. Here each decoder layer's `forward` is checkpointed (module hooks, e.g. ZeRO-3's, stay
outside and fire again on the sub-modules during the replay) and the caches it was given are
restored to their state before the layer ran, so the replay in backward appends the same K/V
once more instead of twice. Memory per micro-batch: every layer's input (tokens x hidden) plus
one layer's activations at a time, for one more forward of compute.
"""

import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import Cache


def checkpoint_decoder_layers(decoder: nn.Module) -> int:
    """Checkpoint every layer of `decoder.layers` when gradients are on; returns the count."""
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(
            f"{type(decoder).__name__} has no `layers` ModuleList to checkpoint; "
            "set actor.activation_checkpointing=false"
        )
    for layer in layers:
        layer.forward = functools.partial(_checkpointed, layer.forward)
    return len(layers)


def _checkpointed(forward, *args, **kwargs):
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    caches = [v for v in kwargs.values() if isinstance(v, Cache)]
    before = [_snapshot(c) for c in caches]

    def replay(*a, **k):
        for cache, state in zip(caches, before, strict=True):
            _restore(cache, state)
        return forward(*a, **k)

    return checkpoint(replay, *args, use_reentrant=False, **kwargs)


def _snapshot(cache: Cache) -> tuple[list, list[dict]]:
    # Shallow: the K/V tensors are replaced (never written in place) by cache updates.
    return list(cache.layers), [dict(layer.__dict__) for layer in cache.layers]


def _restore(cache: Cache, state: tuple[list, list[dict]]) -> None:
    layers, dicts = state
    cache.layers[:] = layers
    for layer, saved in zip(layers, dicts, strict=True):
        layer.__dict__.clear()
        layer.__dict__.update(saved)
