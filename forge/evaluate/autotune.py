"""Helion's autotuner for a Helion candidate, as the judge asks for it (issue 18 item 2).

The worker that judges Python candidates loads the candidate and runs Helion's autotuner on each kernel its
launcher calls, on inputs of the task's shapes placed in the arena (forge.evaluate.helion_tune). What comes
back is data, checked here field by field: each kernel's name and a config of plain values (numbers, booleans,
short strings, lists of them). The config goes into a new candidate's source, in the kernel's
`config=helion.Config(...)`, and that candidate is judged as any other: the autotuner's own accuracy check
and timings decide nothing.

Important: this module loads no candidate into forge's process; only the worker does.
"""

from __future__ import annotations

import ast
import json
import keyword
import math
import secrets
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from forge.backends import BACKENDS
from forge.evaluate.live import loaded_and_placed
from forge.evaluate.remote import Rejected, Remote
from forge.evaluate.verify import generator, make_input
from forge.kernel import Candidate, Status, TaskSpec

if TYPE_CHECKING:
    from forge.evaluate.parent import Worker

MAX_KEYS = 64  # a config's entries: Helion's have a dozen or two
MAX_TEXT = 64  # characters of a string value
MAX_ITEMS = 64  # elements of a list value


@dataclass(frozen=True)
class Tuned:
    """What an autotune gave: the candidate with the configs written in (None on a failure, `message` says
    why), the seconds it took, and each kernel's config as rendered."""

    candidate: Candidate | None
    seconds: float
    message: str = ""
    configs: tuple[tuple[str, str], ...] = ()


def _value(v: Any, depth: int = 0) -> bool:
    if isinstance(v, bool) or v is None:
        return True
    if isinstance(v, int):
        return abs(v) < 1 << 31
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, str):
        return len(v) <= MAX_TEXT and all(c.isalnum() or c in "_-." for c in v)
    if isinstance(v, list):
        return depth < 2 and len(v) <= MAX_ITEMS and all(_value(x, depth + 1) for x in v)
    return False


def parse_configs(message: str, kernels: set[str]) -> dict[str, dict[str, Any]]:
    """The worker's answer ([[kernel, config], ...]) checked: known kernel names, identifier keys, plain values.
    ValueError for anything else."""
    found = json.loads(message)
    if not isinstance(found, list) or not found:
        raise ValueError("no configs")
    out: dict[str, dict[str, Any]] = {}
    for item in found:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and item[0] in kernels
                and isinstance(item[1], dict)):
            raise ValueError(f"not a [kernel, config] pair of this candidate: {str(item)[:100]}")
        name, config = item
        if not config or len(config) > MAX_KEYS or not all(
                isinstance(k, str) and k.isidentifier() and not keyword.iskeyword(k) and _value(v)
                for k, v in config.items()):
            raise ValueError(f"a config that is not plain data: {str(config)[:200]}")
        out[name] = config
    return out


def config_text(config: dict[str, Any], call: str = "helion.Config") -> str:
    """`helion.Config(key=value, ...)` in source form (`call`: the name the module calls it by), keys sorted."""
    return f"{call}(" + ", ".join(f"{k}={v!r}" for k, v in sorted(config.items())) + ")"


def kernel_names(source: str) -> set[str]:
    """The functions of a Helion module whose decorator call names a `config=`."""
    return {f.name for f in ast.parse(source).body if isinstance(f, ast.FunctionDef) and _config_of(f)}


def _config_of(f: ast.FunctionDef) -> ast.expr | None:
    for d in f.decorator_list:
        if isinstance(d, ast.Call):
            for kw in d.keywords:
                if kw.arg == "config":
                    return kw.value
    return None


def with_configs(source: str, configs: dict[str, dict[str, Any]]) -> str:
    """The source with each named kernel's `config=` value replaced (the rest as it was, comments too), called as
    the module called it (`helion.Config`, or the name it imported). ValueError when the result does not hold
    exactly those configs where they were."""
    lines = source.splitlines(keepends=True)
    spans, wanted = [], {}
    for f in ast.parse(source).body:
        node = _config_of(f) if isinstance(f, ast.FunctionDef) and f.name in configs else None
        if node is not None:
            assert node.end_lineno is not None and node.end_col_offset is not None
            call = ast.unparse(node.func) if isinstance(node, ast.Call) else "helion.Config"
            wanted[f.name] = config_text(configs[f.name], call)
            spans.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, wanted[f.name]))
    for lo, lo_col, hi, hi_col, text in sorted(spans, reverse=True):  # from the end: earlier offsets hold
        first, last = lines[lo - 1].encode(), lines[hi - 1].encode()  # ast's offsets are in UTF-8 bytes
        lines[lo - 1:hi] = [first[:lo_col].decode() + text + last[hi_col:].decode()]
    tuned = "".join(lines)
    found = {f.name: ast.unparse(c) for f in ast.parse(tuned).body
             if isinstance(f, ast.FunctionDef) and f.name in wanted and (c := _config_of(f)) is not None}
    if found != {n: ast.unparse(ast.parse(t, mode="eval").body) for n, t in wanted.items()}:
        raise ValueError("the configs did not land where the kernels name theirs")
    return tuned


def autotune_once(worker: Worker, task: TaskSpec, cand: Candidate, path: str, effort: str, budget_s: int,
                  timeout_s: float) -> Tuned:
    """Helion's autotuner on a built Helion candidate in the worker that judges Python candidates; the
    candidate with the configs it chose, or why not."""
    names = kernel_names(cand.source)
    if not BACKENDS[cand.backend].autotunes or not names:
        return Tuned(None, 0.0, "not a Helion candidate with a config to tune")
    worker = worker.for_backend(cand.backend)
    start = time.perf_counter()
    remote = Remote(worker, worker.device, start + timeout_s)
    try:
        placed, outputs = loaded_and_placed(remote, task, cand.backend, path, cand.entry)
        gen = generator(worker.device, secrets.randbits(40))
        for k, (view, m) in enumerate(zip(placed, task.inputs, strict=True)):
            view.copy_(make_input(m, k, gen, worker.device))
        reply, _ = remote.tune(placed, outputs, effort, budget_s)
        configs = parse_configs(reply.message, names)
        return Tuned(replace(cand, source=with_configs(cand.source, configs)), time.perf_counter() - start,
                     configs=tuple((n, config_text(c)) for n, c in configs.items()))
    except Rejected as r:
        return Tuned(None, time.perf_counter() - start, f"{r.result.status.value}: {r.result.message[:300]}")
    except (torch.OutOfMemoryError, MemoryError) as e:
        return Tuned(None, time.perf_counter() - start, f"{Status.OUT_OF_MEMORY.value}: {e}"[:300])
    except Exception as e:  # noqa: BLE001 - an answer nothing can be made of (the worker's to send) is no config
        return Tuned(None, time.perf_counter() - start, f"the autotuner's answer was refused: "
                     f"{type(e).__name__}: {e}"[:400])
    finally:
        worker.arena.reset()
        worker.arena.shrink()
