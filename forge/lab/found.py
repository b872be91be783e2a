"""The kernels the user's own runs found: each stored task's best verified kernel, with its speedup, a link to
its search tree in `forge ui`, and what the lab needs to run it live: the task's source (the eager reference)
and the stored kernel. Read from the store through forge.review.data (only the store module knows SQLAlchemy).

The store keeps a task's source, not its tensor metadata: `task_spec` reads it back from the source, where
forge.tasks.cut.render wrote it (each input's annotation, each value's comment). It keeps a kernel's knobs,
not its compiler flags: `flags` gives the ones the recipes derive from their fast_math knob.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import torch

from forge.backends import BACKENDS
from forge.capture.export import TensorMeta, contiguous_stride
from forge.kernel import Candidate, TaskSpec
from forge.tasks.ops import FAMILIES

log = logging.getLogger(__name__)
MAX_ELEMENTS = 1 << 24  # of a found task's inputs and outputs together: what a live run may allocate

# forge.tasks.cut.render's annotations: `in0: "f32[2, 8] stride(1, 2)"` and `v3 = ...  # bf16[4]`
_META = r'([a-z][a-z0-9]*)\[([0-9, ]*)\](?: stride\(([0-9, -]*)\))?'
_INPUT = re.compile(rf'\b(in\d+): "{_META}"')
_VALUE = re.compile(rf'^    (v\d+) = .*  # {_META}$', re.M)
_RETURN = re.compile(r'^    return \(([^)]*)\)$', re.M)
_SHORT = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "i64": "int64", "i32": "int32", "b8": "bool",
          "f64": "float64", "u8": "uint8", "i8": "int8"}  # TensorMeta.short's names


@dataclass(frozen=True)
class Found:
    """One run's best kernel for one task."""

    run_id: str
    model: str
    task_id: int
    task: str
    family: str
    backend: str
    speedup: float | None
    tree_url: str  # the task's page in forge ui
    source: str = ""  # the task's source: the eager reference
    kernel: str = ""  # the stored winner's source
    entry: str = ""
    knobs: tuple[tuple[str, Any], ...] = ()
    device: str = ""  # of the run

    @property
    def slug(self) -> str:
        """Its name in the lab's URLs (run and task)."""
        return f"{self.run_id}-{self.task_id}"

    @property
    def knobs_text(self) -> str:
        """Its knobs as k=v pairs."""
        return " ".join(f"{k}={v}" for k, v in self.knobs)

    def spec(self) -> TaskSpec:
        """The task, read back from its source (ValueError if the source has no metadata to read)."""
        return task_spec(self.task, self.source)

    def candidate(self) -> Candidate:
        """The stored kernel, with the flags it was built with."""
        return Candidate(self.backend, self.kernel, self.entry, flags(self.backend, dict(self.knobs)))

    def runs_on(self, device: str) -> bool:
        """True when its backend's kernels run on this device type."""
        return BACKENDS[self.backend].device == ("cuda" if device.startswith("cuda") else "cpu")


def flags(backend: str, knobs: dict[str, Any]) -> tuple[str, ...]:
    """A stored kernel's compiler flags from its knobs: the recipes' fast_math (GCC's -ffast-math, else
    -fno-math-errno; nvcc's --use_fast_math); none for a kernel without that knob (an LLM's)."""
    if "fast_math" not in knobs:
        return ()
    b = BACKENDS[backend]
    return b.fast_math if knobs["fast_math"] else b.exact_math


def _meta(short: str, shape: str, stride: str | None) -> TensorMeta:
    dims = tuple(int(s) for s in shape.split(",") if s.strip())
    dtype = _SHORT.get(short, short)
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise ValueError(f"Invalid task source: unknown dtype {short!r}")
    strides = tuple(int(s) for s in stride.split(",") if s.strip()) if stride else contiguous_stride(dims)
    return TensorMeta(dims, dtype, strides)


def task_spec(key: str, source: str) -> TaskSpec:
    """The TaskSpec of a rendered task's source (forge.tasks.cut.render): inputs from the parameters'
    annotations, outputs from the returned values' comments, in the layout kernels write them."""
    inputs = tuple(_meta(*m.groups()[1:]) for m in _INPUT.finditer(source))
    values = {m[1]: _meta(m[2], m[3], m[4]) for m in _VALUE.finditer(source)}
    ret = _RETURN.search(source)
    names = [n.strip() for n in ret[1].split(",") if n.strip()] if ret else []
    if not inputs or not names or any(n not in values for n in names):
        raise ValueError(f"Invalid task source of {key}: no tensor metadata to read")
    outputs = tuple(values[n].written() for n in names)
    return TaskSpec(key, source, inputs, outputs, sum(m.nbytes for m in inputs + outputs))


def make_inputs(spec: TaskSpec, lo: float, hi: float, seed: int = 0) -> list[torch.Tensor]:
    """Inputs for a live run (CPU): floats uniform over [lo, hi], integers and booleans at random, each in its
    meta's shape and stride; ValueError when the task is too large to run live (MAX_ELEMENTS)."""
    total = sum(m.numel for m in spec.inputs + spec.outputs)
    if total > MAX_ELEMENTS:
        raise ValueError(f"Invalid run: the task has {total} elements, more than {MAX_ELEMENTS} run live")
    gen = torch.Generator().manual_seed(seed)
    out = []
    for m in spec.inputs:
        span = 1 + sum((s - 1) * st for s, st in zip(m.shape, m.stride, strict=True)) if m.numel else 0
        if m.torch_dtype.is_floating_point:
            flat = (torch.rand(span, generator=gen, dtype=torch.float64) * (hi - lo) + lo).to(m.torch_dtype)
        elif m.torch_dtype == torch.bool:
            flat = torch.randint(0, 2, (span,), generator=gen).bool()
        else:
            flat = torch.randint(0, 16, (span,), generator=gen).to(m.torch_dtype)
        out.append(flat.as_strided(m.shape, m.stride))
    return out


def picture(spec: TaskSpec) -> str:
    """The picture a found kernel is shown with: heatmaps for matrices and larger, histograms otherwise."""
    return "heatmap" if spec.outputs and len(spec.outputs[0].shape) >= 2 else "histogram"


def found_kernels(store: Any, ui_url: str, limit: int = 200) -> list[Found]:
    """Every stored task's best kernel that passed (newest runs first), at most `limit`."""
    from forge.review.data import task_view

    out: list[Found] = []
    for run in store.list_runs():
        for task in store.get_tasks(run.id):
            best = task_view(store, task).best_node
            if best is None or best.baseline or best.status != "ok":
                continue
            family = task.family if task.family in FAMILIES else "other"
            out.append(Found(run.id, run.model, task.id, task.key, family, best.cand.backend, best.speedup,
                             f"{ui_url.rstrip('/')}/runs/{run.id}/tasks/{task.id}", task.source, best.cand.source,
                             best.cand.entry, tuple(sorted(best.cand.knobs.items())), run.device))
            if len(out) >= limit:
                return out
    return out
