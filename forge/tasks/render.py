"""What a person sees in the terminal: rich tables of profiles (and, later, runs)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from forge import terminal
from forge.capture.profile import Profile
from forge.confidence import fmt as fmt_speedup
from forge.confidence import noisy, speedup_ci
from forge.kernel import Candidate, EvalResult
from forge.tasks.cut import Task
from forge.terminal import Col


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
    console = console or terminal.console()
    timed = prof.total_ms is not None
    title = f"{prof.model} on {prof.device} ({prof.dtype}): {len(prof.tasks)} tasks from {prof.nodes} nodes"
    if timed:
        title += f", {prof.total_ms:.3f} ms summed over nodes"
        if prof.forward_ms is not None:
            title += f", forward {prof.forward_ms:.3f} ms"
    blocks = prof.extra.get("blocks")
    if blocks:  # forge.capture.blocks: nodes counts each distinct block once
        title += f" (block-wise: {sum(blocks.values())} blocks, {len(blocks)} distinct, captured once each)"
    cols = [Col("#", True), Col("task"), Col("family"), Col("count", True)]
    if timed:
        cols += [Col("ms", True), Col("share", True), Col("cum.", True)]
    cols += [Col("first input"), Col("ops")]
    cum, cells = 0.0, []
    rows = prof.tasks if top <= 0 else prof.tasks[:top]
    for i, t in enumerate(rows, 1):
        row = [str(i), t.key, t.family, str(t.count)]
        if timed:
            cum += t.share or 0.0
            row += [f"{t.ms:.3f}", f"{100 * (t.share or 0):.1f}%", f"{100 * cum:.1f}%"]
        row += [t.inputs[0].short() if t.inputs else "-", _ops_summary(t.ops)]
        cells.append(row)
    table = terminal.table(cols, cells, console.width, title=title)
    console.print(table)
    if len(rows) < len(prof.tasks):
        console.print(f"... {len(prof.tasks) - len(rows)} more tasks (--top 0 shows all)")


def print_eval(task: Task, cand: Candidate, res: EvalResult, console: Console | None = None) -> None:
    """Print one evaluation as a two-column table."""
    console = console or terminal.console()
    ok = res.status.passed
    table = Table(title=f"{cand.backend} kernel for {task.key} ({task.family})", title_justify="left",
                  show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("status", f"[{'green' if ok else 'red'}]{res.status.value}[/]")
    if res.message:
        table.add_row("message", res.message)
    table.add_row("build", f"{res.build_s:.2f} s")
    errs = [v for r in res.verify.get("sets", []) for k, v in r.items() if k.startswith("err")]
    if errs:
        table.add_row("verify", f"{len(res.verify['sets'])} input sets, max error {max(errs):.2e}")
    if res.timing:
        t = res.timing
        table.add_row("kernel", f"median {t.median_us:.2f} us (p10 {t.p10_us:.2f}, p90 {t.p90_us:.2f}, n={t.n})")
    if res.baseline:
        b = res.baseline
        table.add_row("eager", f"median {b.median_us:.2f} us (p10 {b.p10_us:.2f}, p90 {b.p90_us:.2f}, n={b.n})")
    if res.speedup:
        table.add_row("speedup", fmt_speedup(res.speedup, speedup_ci(res.baseline, res.timing),
                                             noisy(res.timing) or noisy(res.baseline)))
    if res.floor_us:
        table.add_row("floor", f"{res.floor_us:.2f} us ({task.bytes} bytes)")
    console.print(table)
    if not ok and res.build_log and res.status.value == "build_error":
        console.print(res.build_log[-2000:])


def print_optimize(report: Any, console: Console | None = None) -> None:
    """Print an optimize report: the tasks and the end-to-end result."""
    console = console or terminal.console()
    cols = [Col("task"), Col("family"), *(Col(c, True) for c in ("share", "eager us", "best us", "speedup",
                                                                    "cand.")), Col("status"), Col("stopped")]
    rows = [[t.key, t.family, f"{100 * t.share:.1f}%", f"{t.eager_us:.1f}" if t.eager_us else "-",
             f"{t.best_us:.1f}" if t.best_us else "-", fmt_speedup(t.speedup, t.speedup_ci, t.noisy),
             str(t.candidates), t.status, t.stop_reason] for t in report.tasks if t.status != "skipped"]
    mode = "training mode, as constructed" if report.mode == "train" else "eval mode"
    table = terminal.table(cols, rows, console.width, title=f"run {report.run_id} on {report.device} "
                           f"({report.policy}; the model in {mode})")
    console.print(table)
    colour = "green" if report.outputs_match else "red"
    console.print(f"end to end: eager {report.eager_ms:.3f} ms, forge {report.forge_ms:.3f} ms, "
                  f"[bold]{report.speedup:.2f}x[/]; outputs match: [{colour}]{report.outputs_match}[/] "
                  f"(max rel. error {report.max_rel_err:.1e}); kernels in {report.artifact}")
    if report.variant is not None:
        peak = f"; peak memory {report.peak_mem_ratio:.2f}x eager's" if report.peak_mem_ratio else ""
        console.print(f"the model you get: {report.variant.name} (fastest of {len(report.variants)} variants "
                      f"measured end to end){peak}")
    elif report.graph_note:
        console.print(f"no CUDA graph: {report.graph_note}")
    if not report.applied:
        console.print(f"not applied: no variant was faster than eager (the patched model took "
                      f"{report.patched_ms:.3f} ms); forge keeps the eager model")
