"""Profile: capture a loaded model, time its nodes, cut it into tasks; the stable JSON format.

JSON (docs/profile-format.md): {"format", "model", "device", "dtype", "total_ms", "forward_ms",
"tasks": [Task.to_json()...], ...}. `total_ms` is the sum of the timed nodes; each task's `ms` is its
summed time over all occurrences and `share` is ms / total_ms. A meta capture has no times (null).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from forge.capture.blocks import blockwise
from forge.capture.export import Capture, capture
from forge.capture.layout import apply as apply_layout
from forge.capture.layout import choose as choose_layout
from forge.capture.model_input import LoadedModel
from forge.capture.timing import time_graph
from forge.files import write
from forge.tasks.cut import Task, build_tasks

log = logging.getLogger(__name__)

FORMAT = "forge.profile/1"


@dataclass(frozen=True)
class Profile:
    """A model's tasks with their times and shares."""

    model: str
    device: str
    dtype: str
    total_ms: float | None
    tasks: tuple[Task, ...]
    forward_ms: float | None = None
    nodes: int = 0
    capture_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # sizes, torch version, notes

    def task(self, key: str) -> Task:
        """The task with this key; raises KeyError listing a few keys."""
        for t in self.tasks:
            if t.key == key:
                return t
        some = ", ".join(t.key for t in self.tasks[:5])
        raise KeyError(f"no task {key!r} in the profile of {self.model} (tasks: {some}, ...)")

    def to_json(self) -> dict[str, Any]:
        """The stable JSON form."""
        return {
            "format": FORMAT,
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "total_ms": self.total_ms,
            "forward_ms": self.forward_ms,
            "nodes": self.nodes,
            "capture_s": round(self.capture_s, 3),
            **self.extra,
            "tasks": [t.to_json() for t in self.tasks],
        }

    def save(self, path: str | Path) -> None:
        """Write the JSON form to `path` (its folder made); UserError naming it when it cannot be written."""
        write(path, json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Profile:
        """Inverse of to_json; raises ValueError on a malformed profile."""
        if not isinstance(d, dict) or "tasks" not in d:
            raise ValueError("Invalid profile: expected a JSON object with a 'tasks' list")
        known = {"format", "model", "device", "dtype", "total_ms", "forward_ms", "nodes", "capture_s",
                 "tasks"}
        return cls(
            model=str(d.get("model", "?")), device=str(d.get("device", "?")), dtype=str(d.get("dtype", "?")),
            total_ms=d.get("total_ms"), tasks=tuple(Task.parse(t) for t in d["tasks"]),
            forward_ms=d.get("forward_ms"), nodes=int(d.get("nodes", 0)),
            capture_s=float(d.get("capture_s", 0.0)), extra={k: v for k, v in d.items() if k not in known},
        )

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        """Read a profile JSON file."""
        try:
            return cls.parse(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as e:
            raise ValueError(f"Invalid profile {path}: not JSON ({e})") from e


def profile_blockwise(loaded: LoadedModel, extra: dict[str, Any] | None = None, budget_s: float = 1.0
                      ) -> Profile | None:
    """A model's tasks captured one distinct block at a time (forge.capture.blocks), timed on a real device
    (the glue and each kind of block for about `budget_s`, a task's time summed over its blocks) and untimed
    on meta; None where the model has no repeated blocks to cut it by. The layout is the model's own."""
    timed = loaded.device != "meta"
    bw = blockwise(loaded.model, loaded.inputs, budget_s if timed else None)
    if bw is None:
        return None
    info = {"torch": torch.__version__, **(extra or {}), "layout": "", "blocks": bw.blocks}
    total = sum(t.ms or 0.0 for t in bw.tasks) if timed else None
    if timed:
        info["timing"] = {"method": "per-node medians under an FX interpreter, each kind of block once"}
    return Profile(loaded.name, loaded.device, loaded.dtype, total, bw.tasks, None, bw.nodes, bw.seconds, info)


def profile_model(loaded: LoadedModel, *, budget_s: float = 5.0, extra: dict[str, Any] | None = None,
                  layout: str | None = None) -> tuple[Profile, Capture]:
    """Capture `loaded` in `layout` (None: the one forge.capture.layout.choose measures to be fastest), time every
    node on its device (unless meta) and cut it into tasks."""
    cap = capture(loaded.model, loaded.inputs)
    if layout is None:
        layout = choose_layout(cap, loaded.inputs, loaded.device)
    cap = apply_layout(cap, layout, loaded.inputs)
    graph = cap.graph_module.graph
    nodes = sum(1 for n in graph.nodes if n.op == "call_function")
    info = {"torch": torch.__version__, **(extra or {}), "layout": cap.layout}
    if loaded.device == "meta":
        tasks = build_tasks(graph, None)
        return Profile(loaded.name, "meta", loaded.dtype, None, tuple(tasks), None, nodes, cap.seconds,
                       info), cap
    args = cap.flat_args(loaded.inputs)
    times = time_graph(cap.graph_module, args, loaded.device, budget_s=budget_s)
    tasks = build_tasks(graph, times.node_ms)
    total = sum(t.ms or 0.0 for t in tasks)
    info["timing"] = {"runs": times.runs, "method": "per-node medians under an FX interpreter"}
    if loaded.device.startswith("cuda"):
        info["device_name"] = torch.cuda.get_device_name(loaded.device)
    else:
        info["threads"] = torch.get_num_threads()
    return Profile(loaded.name, loaded.device, loaded.dtype, total, tuple(tasks), times.forward_ms, nodes,
                   cap.seconds, info), cap
