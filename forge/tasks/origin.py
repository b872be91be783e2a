"""Where a task came from in the user's model: the innermost nn.Module its ops ran in, and that module's
`forward` source (what a prompt shows next to the ATen reference, so a model sees the intent: a causal mask,
a scale).

Important: read from the capture's `nn_module_stack` node metadata; a graph without it (a region made by
hand, a meta capture without stacks) gives an empty origin, never an error.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
import textwrap
from collections import Counter

import torch.fx

from forge.capture.scans import is_scan, library_source

log = logging.getLogger(__name__)
LIMIT = 4000  # characters of module source a task keeps
SCAN_LIMIT = 12000  # characters of a scan's library function a task keeps (its whole algorithm, docstring and all)


def origin(nodes: list[torch.fx.Node]) -> tuple[str, str]:
    """(`path (ClassName)`, the class's forward source) of the innermost module most of `nodes` ran in."""
    stacks = [list((n.meta.get("nn_module_stack") or {}).values()) for n in nodes]
    innermost = Counter(s[-1] for s in stacks if s)
    if not innermost:
        return "", ""
    (path, kind), _ = innermost.most_common(1)[0]
    cls = kind if isinstance(kind, type) else _resolve(str(kind))
    name = cls.__qualname__ if cls else str(kind).rsplit(".", 1)[-1]
    where = f"{path or '(the model itself)'} ({name})"
    if cls is None:
        return where, ""
    try:
        return where, textwrap.dedent(inspect.getsource(cls.forward))[:LIMIT]
    except (OSError, TypeError) as e:  # defined in a REPL, or a C extension
        log.debug("no source for %s: %s", name, e)
        return where, ""


def _resolve(qualified: str) -> type | None:
    """The class a stack names as "module.Class" (export keeps a string), if its module is loaded."""
    mod_name, _, name = qualified.rpartition(".")
    mod = sys.modules.get(mod_name)
    if mod is None and mod_name.startswith("torch."):
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            return None
    found = getattr(mod, name, None) if mod is not None else None
    return found if isinstance(found, type) else None


def scan_origin(nodes: list[torch.fx.Node]) -> tuple[str, str] | None:
    """For a region of a scan op (forge.capture.scans): (`path (Class), calling module.function`, that library
    function's source: the loop a policy replaces); None for other regions."""
    scan = next((n for n in nodes if is_scan(n.target)), None)
    if scan is None:
        return None
    impl = str(scan.args[-1])
    where, _ = origin(nodes)
    return f"{where}, calling {impl}".lstrip(", "), library_source(impl)[:SCAN_LIMIT]
