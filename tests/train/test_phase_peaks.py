"""Each phase's peak memory (sparrow/train/memory/peaks.py through the PhaseTimer): the peak is a
phase's own, not the high-water mark an earlier phase left (the reset at its entry), on the host
(the kernel's VmHWM) and through the CUDA branch (torch.cuda stood in for by a counting
allocator); and a real loop's metrics.jsonl carries `memory/peak_gib/<phase>` per step with
memory.measure_phases, and nothing without it."""

import json

import pytest
import torch
from test_loop_fake_actor import _trainer

from sparrow.train.memory import peaks
from sparrow.train.memory.peaks import CudaPeaks, HostPeaks, phase_peaks
from sparrow.train.phase_timer import PhaseTimer

MiB = 2**20
BIG = 200 * MiB  # an mmap'd block (over glibc's threshold): returned to the kernel on free


def _host() -> HostPeaks:
    host = phase_peaks()
    if not isinstance(host, HostPeaks):
        pytest.skip("no /proc/self/clear_refs here: the host's peak is not measured")
    return host


def _touch(nbytes: int) -> torch.Tensor:
    return torch.ones(nbytes // 4, dtype=torch.float32)  # written: every page resident


def test_a_phase_after_a_large_one_reports_its_own_peak():
    timer = PhaseTimer(_host())
    with timer("big"):
        block = _touch(BIG)
        del block
    with timer("small"):
        block = _touch(MiB)
        del block
    metrics = timer.metrics()
    big, small = metrics["memory/peak_gib/big"], metrics["memory/peak_gib/small"]
    # Without the reset the second phase reads the first's high-water mark: small == big.
    assert big - small > 0.75 * BIG / 2**30, (big, small)
    assert small >= metrics["memory/resident_gib"] - 0.1  # the process itself is in both


def test_a_phase_entered_twice_keeps_its_largest_peak_and_an_outer_phase_its_inner_ones():
    timer = PhaseTimer(_host())
    with timer("rollout"):
        block = _touch(BIG)
        del block
    with timer("rollout"):
        pass
    with timer("outer"):
        block = _touch(BIG)  # before the inner phase's reset: credited to the outer one then
        del block
        with timer("inner"):
            pass
    metrics = timer.metrics()
    resident = metrics["memory/resident_gib"]
    assert metrics["memory/peak_gib/rollout"] > resident + 0.15
    assert metrics["memory/peak_gib/outer"] > resident + 0.15
    assert metrics["memory/peak_gib/inner"] < metrics["memory/peak_gib/outer"] - 0.15


class _CountingAllocator:
    """torch.cuda's peak statistics over bytes the test allocates and frees by hand."""

    def __init__(self):
        self.live = self.peak = 0

    def alloc(self, n: int) -> None:
        self.live += n
        self.peak = max(self.peak, self.live)

    def free(self, n: int) -> None:
        self.live -= n

    def reset_peak_memory_stats(self) -> None:
        self.peak = self.live


def test_on_cuda_the_allocator_peak_is_reset_per_phase(monkeypatch):
    cuda = _CountingAllocator()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", cuda.reset_peak_memory_stats)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: cuda.live)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: cuda.peak)
    cuda.alloc(3 * 2**30)  # resident
    memory = phase_peaks()
    assert isinstance(memory, CudaPeaks)
    timer = PhaseTimer(memory)
    with timer("update"):
        cuda.alloc(2 * 2**30)
        cuda.free(2 * 2**30)
    with timer("sync"):
        cuda.alloc(2**29)
        cuda.free(2**29)
    metrics = timer.metrics()
    assert metrics["memory/resident_gib"] == 3.0
    assert metrics["memory/peak_gib/update"] == 5.0
    assert metrics["memory/peak_gib/sync"] == 3.5


def test_without_a_source_nothing_is_logged(monkeypatch):
    monkeypatch.setattr(peaks, "CLEAR_REFS", "/nonexistent/clear_refs")
    assert phase_peaks() is None
    timer = PhaseTimer(phase_peaks())
    with timer("update"):
        pass
    assert not [k for k in timer.metrics() if k.startswith("memory/")]


def _steps(run_dir) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] >= 1]


def test_by_default_the_run_peak_is_left_alone(tmp_path):
    """Off, nothing resets the process's peak: ru_maxrss and /usr/bin/time hold the run's."""
    _trainer(tmp_path, "rl.steps=1").fit()
    (row,) = _steps(tmp_path)
    assert not [k for k in row if k.startswith("memory/")]


def test_the_loop_logs_each_phase_peak(tmp_path):
    _host()
    _trainer(tmp_path, "rl.steps=2", "memory.measure_phases=true").fit()
    steps = _steps(tmp_path)
    assert len(steps) == 2
    for row in steps:
        held = {k: v for k, v in row.items() if k.startswith("memory/")}
        for phase in ("rollout", "rewards", "update", "sync"):
            assert 0.05 < held[f"memory/peak_gib/{phase}"] < 1024, held
        assert 0.05 < held["memory/resident_gib"] < 1024, held
