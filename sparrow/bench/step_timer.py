"""Timing one decode step: CUDA events on a GPU, the wall clock on a CPU, and the host's share.

`StepTimer.time(step)` runs `step()` (which returns a device tensor whose values the caller reads
afterwards) and returns its milliseconds. On CUDA, events are recorded on the stream before and
after the step's launches, so the interval is what the GPU saw, including any time it waited
for the host to plan or launch; the read-back that ends a step happens after the second event.

Host share: the part of a step during which the GPU ran no kernel, i.e. it waited for the host
between launches: 1 - (kernel time of the step) / (step time), with the kernel time from the
profiler's device events over a few steps (`kernel_ms`). A step bound by launches (small batch,
eager) has a large share; one CUDA-graph replay leaves the GPU busy. Not defined on a CPU (the
host does all the work), reported as None there.
"""

import statistics
import time
from collections.abc import Callable

import torch


class StepTimer:
    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.clock = "cuda events" if self.cuda else "wall clock"

    def time(self, step: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
        """(ms, output) of one call of `step`."""
        if not self.cuda:
            start = time.perf_counter()
            out = step()
            return 1e3 * (time.perf_counter() - start), out
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        out = step()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end), out

    def kernel_ms(
        self, run_steps: Callable[[], None], num_steps: int, min_events: int = 1
    ) -> tuple[float | None, float]:
        """(mean GPU busy time per step, device events per step) while `run_steps()` runs
        `num_steps` whole steps: kernels and copies, from the profiler. The time is None on a
        CPU, or when fewer than `min_events` device events per step were seen (a profiler that
        does not trace the kernels inside a CUDA-graph replay)."""
        if not self.cuda or num_steps < 1:
            return None, 0.0
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run_steps()
            torch.cuda.synchronize(self.device)
        device = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        per_step = len(device) / num_steps
        busy_us = sum(e.time_range.elapsed_us() for e in device)
        if per_step < min_events or busy_us <= 0:
            return None, per_step
        return busy_us / 1e3 / num_steps, per_step


def host_share(step_ms: float, kernel_ms: float | None) -> float | None:
    """1 - kernel time / step time, clipped to [0, 1]; None without a kernel time."""
    if kernel_ms is None or step_ms <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - kernel_ms / step_ms))


def summary(times_ms: list[float]) -> dict:
    """Median (the figure), min, max and every time of the timed steps."""
    return {
        "step_ms": statistics.median(times_ms),
        "min_ms": min(times_ms),
        "max_ms": max(times_ms),
        "steps_ms": [round(t, 4) for t in times_ms],
    }
