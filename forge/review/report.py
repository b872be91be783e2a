"""forge report: a run's end-to-end result, tasks, op-family times, search progress and cost.

Three forms of the same content: the terminal (rich), JSON (docs/review.md) and one self-contained HTML
file (inline CSS and SVG, no script, nothing fetched).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from forge import terminal
from forge.files import write
from forge.review import html
from forge.review.data import RunView
from forge.terminal import Col

log = logging.getLogger(__name__)


def report_json(view: RunView) -> dict[str, Any]:
    """The report as JSON-ready data (its format is in docs/review.md)."""
    s, r, c = view.summary, view.run, view.summary.cost
    return {
        "run_id": r.id, "model": r.model, "device": r.device, "dtype": r.dtype, "policy": r.policy, "state": r.state,
        "created_at": r.created_at.isoformat(), "finished_at": r.finished_at.isoformat() if r.finished_at else None,
        "eager_ms": r.eager_ms, "forge_ms": r.forge_ms, "speedup": s.speedup, "applied": s.applied,
        "artifact": r.config.get("artifact"),
        "tasks": [{"id": t.task.id, "key": t.task.key, "family": t.task.family, "count": t.task.count,
                   "ms": t.task.ms, "share": t.task.share, "state": t.task.state, "stop_reason": t.task.stop_reason,
                   "eager_us": t.eager_us, "best_us": t.best_us, "speedup": t.speedup, "best_node": t.best_id,
                   "speedup_ci": list(t.speedup_ci) if t.speedup_ci else None, "noisy": t.noisy,
                   "verdict": t.verdict,
                   "candidates": t.tried, "failed": t.failed, "improved": t.improved, "best_so_far": list(t.curve),
                   "decided": t.progress.decided}
                  for t in view.tasks],
        "against_wall_time": [{"series": name, "points": [[x, y] for x, y in pts]} for name, pts in view.wall_series()],
        "families": [{"family": f, "before_ms": b, "after_ms": a} for f, b, a in view.families()],
        "cost": {"usd": c.usd, "tokens_in": c.tokens_in, "tokens_out": c.tokens_out,
                 "device_seconds": c.device_seconds, "wall_seconds": s.wall_s, "llm_calls": c.llm_calls,
                 "evaluations": c.evaluations, "speedup_gain_per_usd": s.per_dollar(),
                 "speedup_gain_per_device_hour": s.per_device_hour()},
    }


def report_html(view: RunView) -> str:
    """The report as one HTML document that needs no network and runs no script."""
    return str(html.page("report.html", f"forge report {view.run.id}", inline_css=True,
                     sections=html.run_sections(view, link=False)))


def write_report(view: RunView, html_path: str | Path | None = None, json_path: str | Path | None = None) -> None:
    """Write the HTML and/or JSON forms."""
    import json

    if html_path:
        write(html_path, report_html(view))
        log.info("wrote %s", html_path)
    if json_path:
        write(json_path, json.dumps(report_json(view), indent=1) + "\n")
        log.info("wrote %s", json_path)


def write_comparison(a: RunView, b: RunView, html_path: str | Path) -> None:
    """Write two runs side by side as one self-contained HTML file (no script, nothing fetched)."""
    from forge.review.compare import compare_page

    write(html_path, str(compare_page(a, b, inline_css=True)))
    log.info("wrote %s", html_path)


def sparkline(values: tuple[float | None, ...] | list[float | None]) -> str:
    """Values as a row of block characters (lowest to highest; a space where there is none)."""
    got = [v for v in values if v is not None]
    if not got:
        return ""
    lo, hi = min(got), max(got)
    bars = "▁▂▃▄▅▆▇█"
    return "".join(" " if v is None else bars[round((len(bars) - 1) * (v - lo) / ((hi - lo) or 1.0))] for v in values)


def print_report(view: RunView, console: Console | None = None) -> None:
    """The report in the terminal."""
    console = console or terminal.console()
    s, r, c = view.summary, view.run, view.summary.cost
    console.print(Text(f"run {r.id}: {r.model} on {r.device} ({r.dtype}), policy {r.policy}, {r.state}",
                       style="bold"))
    if r.eager_ms and r.forge_ms:
        line = Text(f"end to end: eager {r.eager_ms:.3f} ms, forge {r.forge_ms:.3f} ms, ")
        line.append(html.fmt_x(s.speedup), style="bold")
        if not s.applied:
            line.append(" (forge kept the eager model)")
        console.print(line)
    if r.config.get("artifact"):  # absolute (runs before 2026-12 did not record it)
        console.print(Text(f"artifact: {r.config['artifact']}"))
    cols = [Col("task"), Col("family"), *(Col(c, True) for c in ("share", "eager us", "best us", "speedup", "tried",
                                                                    "failed")), Col("curve"), Col("stopped")]
    rows = [[Text(t.task.key), Text(t.task.family), f"{100 * (t.task.share or 0):.1f}%", html.fmt_num(t.eager_us, 1),
             html.fmt_num(t.best_us, 1), html.fmt_speedup(t), str(t.tried), str(t.failed), sparkline(t.curve),
             Text(t.task.stop_reason or t.task.state)] for t in view.tasks]
    table = terminal.table(cols, rows, console.width, title="tasks")
    console.print(table)
    top = max((b for _, b, _ in view.families()), default=1.0) or 1.0
    bars = [[Text(f), f"{b:.3f}", f"{a:.3f}", Text("█" * round(20 * a / top) + "░" * round(20 * (b - a) / top),
                                                   style="cyan")] for f, b, a in view.families()]
    fams = terminal.table([Col("family"), Col("before", True), Col("after", True), Col("")], bars, console.width,
                          title="profiled model time by op family (ms)")
    console.print(fams)
    per_usd, per_hour = s.per_dollar(), s.per_device_hour()
    console.print(f"cost: ${c.usd:.4f} ({c.llm_calls} LLM calls, {c.tokens_in:,} tokens in, {c.tokens_out:,} out), "
                  f"{c.device_seconds:.1f} device s over {c.evaluations} evaluations, wall {html.fmt_secs(s.wall_s)}; "
                  f"speedup gained per $: {'-' if per_usd is None else f'{per_usd:.3g}'}, "
                  f"per device-hour: {'-' if per_hour is None else f'{per_hour:.3g}'}", markup=False, highlight=False)
