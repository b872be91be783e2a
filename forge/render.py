"""What a person sees in the terminal: rich tables of profiles (and, later, runs)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from forge.profile import Profile


def _ops_summary(ops: tuple[str, ...], limit: int = 6) -> str:
    names = [o.split(".")[1] if o.startswith("aten.") else o for o in ops]
    names = [n for n in names if n not in ("view", "getitem", "_assert_tensor_metadata")] or names
    seen: list[str] = []
    for n in names:
        if n not in seen:
            seen.append(n)
    return ", ".join(seen[:limit]) + (", ..." if len(seen) > limit else "")


def print_profile(prof: Profile, top: int = 25, console: Console | None = None) -> None:
    """Print a profile's tasks as a table, biggest share first."""
    console = console or Console()
    timed = prof.total_ms is not None
    title = f"{prof.model} on {prof.device} ({prof.dtype}): {len(prof.tasks)} tasks from {prof.nodes} nodes"
    if timed:
        title += f", {prof.total_ms:.3f} ms summed over nodes"
        if prof.forward_ms is not None:
            title += f", forward {prof.forward_ms:.3f} ms"
    table = Table(title=title, title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("task", no_wrap=True)
    table.add_column("family", no_wrap=True)
    table.add_column("count", justify="right")
    if timed:
        table.add_column("ms", justify="right")
        table.add_column("share", justify="right")
        table.add_column("cum.", justify="right")
    table.add_column("first input", no_wrap=True)
    table.add_column("ops", min_width=16)
    cum = 0.0
    rows = prof.tasks if top <= 0 else prof.tasks[:top]
    for i, t in enumerate(rows, 1):
        cells = [str(i), t.key, t.family, str(t.count)]
        if timed:
            cum += t.share or 0.0
            cells += [f"{t.ms:.3f}", f"{100 * (t.share or 0):.1f}%", f"{100 * cum:.1f}%"]
        cells += [t.inputs[0].short() if t.inputs else "-", _ops_summary(t.ops)]
        table.add_row(*cells)
    console.print(table)
    if len(rows) < len(prof.tasks):
        console.print(f"... {len(prof.tasks) - len(rows)} more tasks (--top 0 shows all)")
