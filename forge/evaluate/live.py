"""One call of a built candidate on the caller's own inputs, in the worker (forge lab's live runs).

The evaluation (forge.evaluate.judge) judges a candidate on inputs it draws itself; a person trying a
verified kernel wants it run on theirs (an image, a range of values). The same worker and arena do it: the
inputs are copied into the arena, the candidate is loaded and called once there, and its outputs are read
back here. Nothing is judged: the caller compares the outputs with eager's.

Important: this module loads no candidate into forge's process; only the worker does (forge.evaluate.child).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from forge.capture.export import output_view
from forge.evaluate.remote import Rejected, Remote
from forge.evaluate.steps import Load
from forge.kernel import EvalResult, Status, TaskSpec

if TYPE_CHECKING:
    from forge.evaluate.parent import Worker


def loaded_and_placed(remote: Remote, task: TaskSpec, backend: str, path: str, entry: str
                      ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Load the candidate in the worker and place the task's inputs and outputs in the arena: (the inputs'
    views, to fill; the outputs' views, in the task's shapes)."""
    remote.step(Load(task, backend, path, entry))
    placed, bufs = remote.place(task.inputs, [(m.numel, m.torch_dtype) for m in task.outputs])
    return placed, [output_view(b, m) for b, m in zip(bufs, task.outputs, strict=True)]


def call_once(worker: Worker, task: TaskSpec, backend: str, path: str, entry: str,
              inputs: Sequence[torch.Tensor], timeout_s: float = 60.0) -> tuple[torch.Tensor, ...] | EvalResult:
    """The candidate's outputs (copies, on the worker's device) for these inputs, which must match the task's
    input metadata; an EvalResult (timeout, crash, launch error) when the call fails."""
    if len(inputs) != len(task.inputs):
        raise ValueError(f"Invalid inputs: {len(inputs)} tensors for a task of {len(task.inputs)}")
    for i, (t, m) in enumerate(zip(inputs, task.inputs, strict=True)):
        if tuple(t.shape) != tuple(m.shape) or t.dtype != m.torch_dtype:
            raise ValueError(f"Invalid input {i}: {tuple(t.shape)} {t.dtype}, the task wants {m.short()}")
    worker = worker.for_backend(backend)  # a Python candidate on a confined CUDA worker: its unconfined one
    start = time.perf_counter()
    remote = Remote(worker, worker.device, start + timeout_s)
    try:
        placed, outputs = loaded_and_placed(remote, task, backend, path, entry)
        for view, t in zip(placed, inputs, strict=True):
            view.copy_(t)
        remote.call(placed, outputs)
        remote.sync()
        return tuple(o.clone() for o in outputs)
    except Rejected as r:
        return replace(r.result, device=worker.device, device_s=time.perf_counter() - start)
    except (torch.OutOfMemoryError, MemoryError) as e:
        return EvalResult(Status.OUT_OF_MEMORY, f"{type(e).__name__}: {str(e)[:300]}", device=worker.device)
    finally:
        worker.arena.reset()
        worker.arena.shrink()
