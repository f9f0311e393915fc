"""The memory a step's phases really held, beside what the plan (plan.py) says they hold.

    peaks = phase_peaks()            # None where the process's peak cannot be reset and read
    peaks.reset(); ...; peaks.read() # (bytes held now, peak bytes since the reset)

With memory.measure_phases the trainer's PhaseTimer resets the peak at each phase's entry and
reads it at its exit, so a phase's `memory/peak_gib/<phase>` is the most it held, not the run's
high-water mark so far. Off by default: the reset is the process's own, so /usr/bin/time's
maximum resident size and ru_maxrss (tests/train/test_host_memory.py, `sparrow-bench step`) then
hold only the peak since the last phase's entry, not the run's:
- on a GPU (the run's device when CUDA is present, as build.py places it) the CUDA caching
  allocator's allocated bytes, `torch.cuda.reset_peak_memory_stats` / `max_memory_allocated`:
  the live bytes the plan counts (the allocator's reserved blocks above them are what the
  fit's headroom, memory.usable_fraction, is for);
- on a CPU under Linux the process's resident set: writing "5" to /proc/self/clear_refs resets
  the kernel's high-water mark (VmHWM) to the present RSS, and /proc/self/status reads both
  (exact, not sampled; one write and one read per phase). The plan's CPU phases hold the whole
  process, its runtime and glibc's cached blocks included, as the RSS does;
- elsewhere (no /proc, or clear_refs not writable, as in some sandboxes) nothing is measured
  and nothing logged.
The peak is the process's (the device's under CUDA), so a thread's work beside a phase counts in
it: rl.async.staleness=1's draw during the update, which the plan counts there too (`overlap`).
Only the trainer's own timer measures: the producer thread's timer would reset the peak under
the trainer's phases.

`PLAN_PHASES` names the plan's phases each trainer phase is held against.
"""

import os

import torch

GiB = 2**30
CLEAR_REFS, STATUS = "/proc/self/clear_refs", "/proc/self/status"
# trainer phase (time/<phase>_s) -> the plan's phases it runs (plan.PHASES). The rollout runs
# both the engine's prefill and its decode; the update with rl.dense_pass=update also scores the
# batch (the actor log-probs' pass, inside the step's forward); `monitor` holds the exact
# acceptance's pass where it runs its own (rl.dense_pass=separate) and the speedup probe's
# dense re-rollout on its steps.
PLAN_PHASES = {
    "rollout": ("prefill peak", "decode peak"),
    "logprobs": ("actor log-probs",),
    "monitor": ("monitor exact",),
    "update": ("actor step",),
    "distill": ("distill step",),
}


class HostPeaks:
    """The process's resident set (Linux): VmRSS now, VmHWM since the last reset."""

    def reset(self) -> None:
        with open(CLEAR_REFS, "w") as f:
            f.write("5")

    def read(self) -> tuple[int, int]:
        values = kib_fields(STATUS)
        return values["VmRSS"] * 1024, values["VmHWM"] * 1024


class CudaPeaks:
    """The CUDA caching allocator's allocated bytes on the current device."""

    def reset(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def read(self) -> tuple[int, int]:
        return torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()


def phase_peaks(device: torch.device | None = None) -> HostPeaks | CudaPeaks | None:
    """What measures this process's phases: CUDA where the run is on a GPU (`device`, else
    wherever CUDA is present), the kernel's high-water mark on Linux, else None (no /proc, or
    clear_refs refused: nothing is logged)."""
    if device.type == "cuda" if device is not None else torch.cuda.is_available():
        return CudaPeaks()
    if not (os.path.exists(CLEAR_REFS) and os.path.exists(STATUS)):
        return None
    host = HostPeaks()
    try:
        host.reset()
        host.read()
    except (OSError, KeyError, ValueError):  # a sandbox's /proc without them, or read-only
        return None
    return host


def kib_fields(path: str) -> dict[str, int]:
    """`Name:   1234 kB` lines of a /proc file, in KiB ({"MemAvailable": 0} where it is absent)."""
    fields = {}
    if not os.path.exists(path):
        return {"MemAvailable": 0}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                fields[key] = int(parts[0])
    return fields
