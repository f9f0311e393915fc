"""CUDA-graph capture and replay of the planned decode forward, one graph per step shape.

Decode at small batch is bound by launching kernels, not by running them (~40 per layer, ~5 us
of host time each, against a few ms of GPU work per step): a graph replays the whole forward as
one launch. The forward reads its inputs from static buffers (a `DecodeStep`'s packed rows and
page table) that each replay first overwrites; shapes are the plan's buckets (decode_plan.py),
so a handful of graphs serve a whole generate call. A shape seen for the first time is run
eagerly twice on a side stream (Triton compiles, the allocator warms up; both runs compute this
step exactly, writing the same K/V), then captured, then replayed. Past `max_graphs` shapes the
step runs eagerly. The sampler stays outside: it is per-call state (temperature, top-p) and
few ops per step. All graphs share one memory pool, as at most one of them runs at a time.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from sparrow.rollout.decode_plan import DecodeStep


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: DecodeStep  # static buffers the graph reads
    logits: Tensor  # (B, V) fp32 static output the graph writes


class DecodeGraphs:
    def __init__(self, forward: Callable[[DecodeStep], Tensor], max_graphs: int = 32):
        self.forward = forward  # step -> logits (B, V), free of host syncs
        self.max_graphs = max_graphs
        self._graphs: dict[tuple, _Graph] = {}
        self._pool: Any = None  # the first graph's memory pool (torch's private handle type)
        self.num_captured = 0
        self.num_replayed = 0
        self.num_eager = 0

    def __call__(self, step: DecodeStep) -> Tensor:
        """Logits (B, V) of the step: the graph's output buffer, valid until its next replay."""
        entry = self._graphs.get(step.shape_key)
        if entry is None:
            if len(self._graphs) >= self.max_graphs:
                self.num_eager += 1
                return self.forward(step)
            entry = self._graphs[step.shape_key] = self._capture(step)
        entry.inputs.rows.copy_(step.rows, non_blocking=True)
        entry.inputs.page_table.copy_(step.page_table, non_blocking=True)
        entry.graph.replay()
        self.num_replayed += 1
        return entry.logits

    def _capture(self, step: DecodeStep) -> _Graph:
        inputs = replace(step, rows=step.rows.clone(), page_table=step.page_table.clone())
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.forward(inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self.forward(inputs)
        if self._pool is None:
            self._pool = graph.pool()
        self.num_captured += 1
        return _Graph(graph, inputs, logits)
