"""Backward passes that give the same gradient every time on the CPU.

torch's CPU kernel for `index_put_(accumulate=True)`, the backward of indexing with an index
tensor (`x[idx]`), adds with atomic float adds from several threads once the gradient has at
least 32768 elements and torch runs more than one thread. Where `idx` repeats a row, the order of
those adds, and so the rounding of their sum, follows thread timing. The actor's group-shared
pass indexes exactly so (sparrow.rl.policy_logprobs): the KV cache of the prefix common to a
micro-batch is indexed out to every group (`DynamicCache.batch_select_indices`, index 0 repeated)
and each group's prompt cache out to its rows. This is what made two runs of the default config
(SmolLM2, 8 groups sharing a ~340-token system prompt) part at float level at step 4 and sample
other tokens from step 8. Measured on the 2-core CPU, 40 backwards of that selection ((1, 3, 340,
64) to 8 groups) gave 24 distinct gradients; under torch's deterministic mode the kernel adds
serially: 1 gradient, and faster (23 vs 58 ms: no contended atomics).

`deterministic_backward(device)` turns that mode on around a backward on the CPU and restores it
after, with `fill_uninitialized_memory` off (it would write NaN into every tensor the backward
allocates) and warn-only (an op without a deterministic kernel warns instead of failing).
CUDA runs are left as they are.
"""

from contextlib import contextmanager

import torch
import torch.utils.deterministic


@contextmanager
def deterministic_backward(device: torch.device | str):
    if torch.device(device).type != "cpu":
        yield
        return
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    # The attribute is a property of a module-class swap that type checkers cannot see.
    fill = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]
