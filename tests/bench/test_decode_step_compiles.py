"""`sparrow-bench decode-step` on the Triton interpreter, in all four configurations (sparse and
dense, graphs on and off): no Triton specialisation is first met inside a timed step (each would
be a JIT compile on a GPU), no graph is captured there, and the profiling pass comes after every
capture, never between two.

CUDA graphs on a CPU: `DecodeGraphs._capture` is stood in for by one that runs the forward as the
real capture does (twice to warm up, once "captured") and whose replay runs it again on the
static inputs, so a replayed step launches the same kernels with the same arguments. The
profiler (`StepTimer.kernel_ms`) is stood in for by one that records its session and runs the
steps. The shape is tiny and its rows cross a page-table width that changes Triton's
specialisation (16 -> 17 pages: a stride stops being divisible by 16) and a graph bucket
(16 -> 20 pages) inside the timed steps, unless the bench fixes the width.
"""

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from sparrow.bench import decode_step
from sparrow.bench.step_timer import StepTimer
from sparrow.rollout.cuda_graph import DecodeGraphs, _Graph

ARGS = ["--dtype", "float32", "--context", "60", "--page-size", "4", "--budget-tokens", "16",
        "--batches", "2", "--samples", "2", "--iters", "2", "--warmup", "1", "--profile-steps",
        "1", "--graphs", "off"]  # fmt: skip
TRITON = ["--backend", "triton"]  # the interpreter: ~1 min per run on 2 loaded cores
TORCH = ["--backend", "torch"]  # no Triton: the graph and profiler order only, in seconds


@pytest.fixture
def events(monkeypatch) -> list[str]:
    """What happened, in order: "capture", "profile begin" / "profile end"."""
    log: list[str] = []

    def capture(self, step):
        inputs = replace(step, rows=step.rows.clone(), page_table=step.page_table.clone())
        log.append("capture")
        for _ in range(2):
            self.forward(inputs)
        logits = self.forward(inputs)
        graph = SimpleNamespace(replay=lambda: logits.copy_(self.forward(inputs)))
        self.num_captured += 1
        return _Graph(graph, inputs, logits)

    def kernel_ms(self, run_steps, num_steps, min_events=1):
        log.append("profile begin")
        run_steps()
        log.append("profile end")
        return 1e-3, float(min_events)

    monkeypatch.setattr(DecodeGraphs, "_capture", capture)
    monkeypatch.setattr(StepTimer, "kernel_ms", kernel_ms)
    return log


def rehearse(args) -> dict:
    """The bench's run and profiling pass with graphs on (CPU stand-ins) and off."""
    bench = decode_step.build(args)
    runner = bench.engine.runner
    assert bool(bench.kernel_modules) == (args.backend == "triton")
    runner.graphs, runner.plan.pad_shapes = DecodeGraphs(runner._forward), True
    args.graphs = [True, False]
    report = {"runs": [], "errors": []}
    for batch in args.batches:
        report["runs"] += decode_step.run(bench, args, batch)
    decode_step.profile_pass(bench, args, report)
    return report


def configurations(report: dict) -> list[tuple[bool, str, dict]]:
    return [(r["graphs"], arm, r[arm]) for r in report["runs"] for arm in ("sparse", "dense")]


def test_graphs_are_captured_in_warm_up_and_profiled_after_every_capture(events):
    report = rehearse(decode_step.parse_args(ARGS + TORCH))
    assert [(g, arm) for g, arm, _ in configurations(report)] == [
        (True, "sparse"), (True, "dense"), (False, "sparse"), (False, "dense"),
    ]  # fmt: skip
    for graphs, arm, r in configurations(report):
        assert len(r["steps_ms"]) == 2
        if graphs:  # one capture, in the warm-up; the timed steps replay
            assert r["graph_captures"] == 1 and r["graph_replays"] == 1 + 2, (arm, r)
        else:
            assert r["graph_captures"] == r["graph_replays"] == 0, (arm, r)
        assert r["host_share"] is not None  # profiled
    assert report["errors"] == []
    assert events.count("capture") == 2
    first_profile = events.index("profile begin")
    assert "capture" not in events[first_profile:], events
    assert events[first_profile:] == ["profile begin", "profile end"] * 4


@pytest.mark.slow
def test_no_triton_compile_in_a_timed_step(events):
    report = rehearse(decode_step.parse_args(ARGS + TRITON))
    for graphs, arm, r in configurations(report):
        assert r["jit_compiles_timed"] == 0, (graphs, arm, r)
        if graphs:
            assert r["graph_captures"] == 1 and r["graph_replays"] == 1 + 2, (arm, r)
    assert sum(r["jit_compiles_warmup"] for _, _, r in configurations(report)) > 0
    assert report["errors"] == [] and events.count("capture") == 2


@pytest.mark.slow
@pytest.mark.parametrize("backend", [TORCH, TRITON], ids=["torch", "triton"])
def test_without_a_fixed_width_timed_steps_capture_and_compile(events, monkeypatch, backend):
    """The checks can fail: with the page-table width left to follow the rows (as before), the
    same run meets a new graph shape and new Triton specialisations inside timed steps."""
    monkeypatch.setattr(decode_step, "final_pages", lambda args: 0)
    args = decode_step.parse_args(ARGS + backend)
    bench = decode_step.build(args)
    bench.engine.runner.plan.column_multiple = 1
    monkeypatch.setattr(decode_step, "build", lambda args: bench)
    report = rehearse(args)
    assert events.count("capture") > 2
    if backend == TRITON:
        assert sum(r["jit_compiles_timed"] for _, _, r in configurations(report)) > 0, report


def test_compile_only_runs_every_configuration_s_warm_up_and_nothing_timed(tmp_path):
    """The GPU check's first part: the same configurations' warm-up, no timed or profiled step."""
    path = tmp_path / "compile.json"
    assert decode_step.main([*ARGS, *TORCH, "--compile-only", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert report["compile_only"] and report["errors"] == []
    ((graphs, arm_runs),) = [(r["graphs"], r) for r in report["runs"]]
    assert graphs is False
    for arm in ("sparse", "dense"):
        assert arm_runs[arm]["steps_ms"] == [] and arm_runs[arm]["host_share"] is None
    assert report["jit_compiles"] is None  # no Triton here: nothing to count
