"""Per-node timing of a captured graph on a real device.

Method: the graph runs node by node under an FX interpreter. CPU: `time.perf_counter_ns` around each
node (CPU ops are synchronous). CUDA: a pair of CUDA events around each node, one device-wide
synchronisation per run, then `Event.elapsed_time`. Warm-up by time (at least two whole runs), then
repeated runs until `min_runs` and a time budget are met; each node's time is its median over the
runs. The end-to-end forward is timed separately, without the interpreter, the same way.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from forge.bench import time_call_us
from forge.tasks.regions import is_noop


@dataclass(frozen=True)
class GraphTimes:
    """Median time per node (ms) and of the whole forward (ms), with how many runs gave them."""

    node_ms: dict[str, float]
    forward_ms: float
    runs: int
    device: str


class _NodeTimer(torch.fx.Interpreter):
    """Runs the graph and records each call_function node's time of this run."""

    def __init__(self, gm: torch.fx.GraphModule, cuda: bool) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.cuda = cuda
        self.pending: list[tuple[str, Any, Any]] = []

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op != "call_function" or is_noop(n):
            return super().run_node(n)
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = super().run_node(n)
            end.record()
        else:
            start = time.perf_counter_ns()
            out = super().run_node(n)
            end = time.perf_counter_ns()
        self.pending.append((n.name, start, end))
        return out

    def collect(self) -> dict[str, float]:
        """This run's times in ms, after the device finished."""
        if self.cuda:
            torch.cuda.synchronize()
            times = {name: s.elapsed_time(e) for name, s, e in self.pending}
        else:
            times = {name: (e - s) / 1e6 for name, s, e in self.pending}
        self.pending = []
        return times


def _repeat(fn: Callable[[], float], warmup_s: float, min_runs: int, budget_s: float,
            max_runs: int) -> list[float]:
    """Call fn (which returns a time) for warm-up, then collect times within the budget."""
    deadline = time.perf_counter() + warmup_s
    fn()
    fn()
    while time.perf_counter() < deadline:
        fn()
    out: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(out) < max_runs and (len(out) < min_runs or time.perf_counter() < deadline):
        out.append(fn())
    return out


def time_graph(gm: torch.fx.GraphModule, args: list[Any], device: str, *, warmup_s: float = 0.5,
               min_runs: int = 5, budget_s: float = 5.0, max_runs: int = 50) -> GraphTimes:
    """Median time of every node of `gm` and of the whole forward on `args` (already on `device`)."""
    cuda = device.startswith("cuda")
    timer = _NodeTimer(gm, cuda)
    per_node: dict[str, list[float]] = {}

    def one_interpreted() -> float:
        timer.run(*args)
        times = timer.collect()
        for k, v in times.items():
            per_node.setdefault(k, []).append(v)
        return sum(times.values())

    def one_forward() -> float:
        return time_call_us(lambda: gm(*args), cuda) / 1e3  # ms

    with torch.no_grad():
        runs = _repeat(one_interpreted, warmup_s, min_runs, budget_s, max_runs)
        # Keep only the measured runs: drop the warm-up samples at the front of every list.
        node_ms = {k: statistics.median(v[-len(runs):]) for k, v in per_node.items()}
        forward = _repeat(one_forward, warmup_s / 2, min_runs, budget_s / 2, max_runs)
    return GraphTimes(node_ms, statistics.median(forward), len(runs), device)


def filled(t: torch.Tensor) -> torch.Tensor:
    """A tensor of `t`'s shape, strides and dtype for timing a block on: standard normal floats, zero integers
    (valid indices and positions), all-true masks (nothing masked out: no row without a key). Strides that
    overlap (an expanded mask, stride 0) are kept: the values are written to the storage under them."""
    size = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
    with torch.no_grad():
        flat = torch.empty(size, dtype=t.dtype, device=t.device)
        if t.dtype.is_floating_point:
            flat.normal_()
        else:
            flat.fill_(True) if t.dtype == torch.bool else flat.zero_()
        return flat.as_strided(t.shape, t.stride())
